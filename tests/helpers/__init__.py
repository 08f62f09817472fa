"""What several test files share: builders of small models and files (imported as `helpers.NAME`)."""
