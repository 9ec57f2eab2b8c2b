"""Explainers of the notebooks: figures and timings that show how a mechanism works
(layout_plots, attention_plots, anatomy of one weak spot, kernel_check); no sweep uses them."""
