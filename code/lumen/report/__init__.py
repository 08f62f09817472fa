"""Figures (matplotlib, Agg: no display needed) and one self-contained HTML page for the looking-inside tools."""
