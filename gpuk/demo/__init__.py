"""``python -m gpuk.demo``: a Keras 2.3.1 CNN + GRU trained with CTC on gpuk reads digit strings.

Modules: glyphs (embedded font), data (renderer), metrics (decoding to strings, accuracy),
settings (defaults), network (the layers, against a ``keras`` module passed in: Keras 2.3.1
here, Keras 3 in bench/keras3_jax.py), model and train (Keras; import after KERAS_BACKEND is
set), plot.
"""
