"""The cell sources of notebooks/*.ipynb, one module per notebook (``CELLS``); written by
scripts/make_notebooks.py."""
