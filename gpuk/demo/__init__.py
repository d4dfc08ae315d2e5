"""``python -m gpuk.demo``: a Keras 2.3.1 CNN + GRU trained with CTC on gpuk reads digit strings.

Modules: glyphs (embedded font), data (renderer), metrics (decoding to strings, accuracy),
settings (defaults), model and train (Keras; import after KERAS_BACKEND is set), plot.
"""
