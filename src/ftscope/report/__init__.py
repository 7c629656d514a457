"""Presentation: terminal tables, plots and the HTML report."""
