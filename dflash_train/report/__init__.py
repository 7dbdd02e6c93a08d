"""`dflash-train report`: one self-contained file to share a run (series.py reads the
stream, plots.py draws with matplotlib, page.py writes the HTML)."""
