"""Predicted vs measured: published cases and profile runs, with honest error figures."""
