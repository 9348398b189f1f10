"""Model files (``modelfile``: nbattn.save / nbattn.load) and the scikit-learn-free
``Predictor`` that ``nbattn predict`` uses."""
