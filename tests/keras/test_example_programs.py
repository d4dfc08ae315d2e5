"""Programs in the style of Keras 2.3.1's examples/ run unchanged on gpuk (issue 17): each
builds its model as the example does, on small generated data, trains a few epochs and
checks that the loss falls. Sizes are tiny so the whole file runs in seconds."""
import numpy as np


def _falls(history, factor):
    losses = history.history['loss']
    return losses[-1] < factor * losses[0]


def test_mnist_cnn_style_convnet(keras):
    """examples/mnist_cnn.py: Conv2D, MaxPooling2D, Dropout, Flatten, Dense on images."""
    layers = keras.layers
    rng = np.random.RandomState(0)
    x = rng.rand(96, 10, 10, 1).astype('float32')
    labels = (x[:, :5].mean(axis=(1, 2, 3)) > x[:, 5:].mean(axis=(1, 2, 3))).astype(int)
    x[:, :5] += (labels[:, None, None, None] - 0.5) * 0.5  # a clear margin: the top half is brighter or darker
    y = keras.utils.to_categorical(labels, 2)
    model = keras.models.Sequential([
        layers.Conv2D(8, (3, 3), activation='relu', input_shape=(10, 10, 1)),
        layers.Conv2D(8, (3, 3), activation='relu'),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Dropout(0.25),
        layers.Flatten(),
        layers.Dense(16, activation='relu'),
        layers.Dropout(0.5),
        layers.Dense(2, activation='softmax')])
    model.compile(loss=keras.losses.categorical_crossentropy,
                  optimizer=keras.optimizers.Adadelta(learning_rate=1.0), metrics=['accuracy'])
    history = model.fit(x, y, batch_size=32, epochs=16, verbose=0, validation_data=(x, y))
    assert _falls(history, 0.8)
    assert model.evaluate(x, y, verbose=0)[1] > 0.8


def _resnet_layer(keras, inputs, filters, strides=1, activation='relu'):
    layers = keras.layers
    x = layers.Conv2D(filters, 3, strides=strides, padding='same',
                      kernel_initializer='he_normal',
                      kernel_regularizer=keras.regularizers.l2(1e-4))(inputs)
    x = layers.BatchNormalization()(x)
    return layers.Activation(activation)(x) if activation else x


def test_cifar10_resnet_style_blocks(keras):
    """examples/cifar10_resnet.py (v1): residual blocks with a strided 1x1 projection."""
    layers = keras.layers
    rng = np.random.RandomState(1)
    x = rng.rand(64, 8, 8, 3).astype('float32')
    y = keras.utils.to_categorical((x[..., 0].mean(axis=(1, 2)) > x[..., 1].mean(axis=(1, 2))), 2)
    inputs = layers.Input(shape=(8, 8, 3))
    h = _resnet_layer(keras, inputs, 8)
    for stack, filters in enumerate([8, 16]):
        strides = 1 if stack == 0 else 2
        block = _resnet_layer(keras, h, filters, strides)
        block = _resnet_layer(keras, block, filters, activation=None)
        if strides != 1:
            h = layers.Conv2D(filters, 1, strides=strides, padding='same')(h)
        h = layers.Activation('relu')(layers.add([h, block]))
    h = layers.AveragePooling2D(pool_size=4)(h)
    outputs = layers.Dense(2, activation='softmax')(layers.Flatten()(h))
    model = keras.models.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), 'categorical_crossentropy', metrics=['accuracy'])
    history = model.fit(x, y, batch_size=16, epochs=6, verbose=0)
    assert _falls(history, 0.7)


def test_lstm_seq2seq_encoder_decoder(keras):
    """examples/lstm_seq2seq.py: an encoder LSTM's states start a decoder LSTM (teacher
    forcing); the task is reversing a sequence of tokens."""
    layers = keras.layers
    rng = np.random.RandomState(2)
    tokens, steps, n = 5, 4, 96
    source = rng.randint(1, tokens, size=(n, steps))
    target = source[:, ::-1]
    one_hot = np.eye(tokens, dtype='float32')
    encoder_input_data = one_hot[source]
    decoder_target_data = one_hot[target]
    decoder_input_data = np.concatenate([np.zeros((n, 1, tokens), 'float32'),
                                         decoder_target_data[:, :-1]], axis=1)
    encoder_inputs = layers.Input(shape=(None, tokens))
    _, state_h, state_c = layers.LSTM(16, return_state=True)(encoder_inputs)
    decoder_inputs = layers.Input(shape=(None, tokens))
    decoder_outputs, _, _ = layers.LSTM(16, return_sequences=True, return_state=True)(
        decoder_inputs, initial_state=[state_h, state_c])
    decoder_outputs = layers.Dense(tokens, activation='softmax')(decoder_outputs)
    model = keras.models.Model([encoder_inputs, decoder_inputs], decoder_outputs)
    model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss='categorical_crossentropy')
    history = model.fit([encoder_input_data, decoder_input_data], decoder_target_data,
                        batch_size=32, epochs=8, verbose=0)
    assert _falls(history, 0.8)


def test_variational_autoencoder_with_a_custom_loss(keras):
    """examples/variational_autoencoder.py: a sampling Lambda and the VAE loss added with
    model.add_loss, compiled without a loss."""
    layers, K = keras.layers, keras.backend
    rng = np.random.RandomState(3)
    original_dim, latent_dim = 16, 2
    codes = rng.randn(128, latent_dim)
    # nearly binary pixels driven by two latent factors (as MNIST digits are nearly binary)
    x_train = 1 / (1 + np.exp(-4 * codes @ rng.randn(latent_dim, original_dim))).astype('float32')

    def sampling(args):
        z_mean, z_log_var = args
        epsilon = K.random_normal(shape=(K.shape(z_mean)[0], K.int_shape(z_mean)[1]))
        return z_mean + K.exp(0.5 * z_log_var) * epsilon

    inputs = layers.Input(shape=(original_dim,), name='encoder_input')
    h = layers.Dense(12, activation='relu')(inputs)
    z_mean = layers.Dense(latent_dim, name='z_mean')(h)
    z_log_var = layers.Dense(latent_dim, name='z_log_var')(h)
    z = layers.Lambda(sampling, output_shape=(latent_dim,), name='z')([z_mean, z_log_var])
    encoder = keras.models.Model(inputs, [z_mean, z_log_var, z], name='encoder')
    latent_inputs = layers.Input(shape=(latent_dim,), name='z_sampling')
    decoded = layers.Dense(original_dim, activation='sigmoid')(
        layers.Dense(12, activation='relu')(latent_inputs))
    decoder = keras.models.Model(latent_inputs, decoded, name='decoder')
    outputs = decoder(encoder(inputs)[2])
    vae = keras.models.Model(inputs, outputs, name='vae_mlp')
    reconstruction_loss = keras.losses.binary_crossentropy(inputs, outputs) * original_dim
    kl_loss = -0.5 * K.sum(1 + z_log_var - K.square(z_mean) - K.exp(z_log_var), axis=-1)
    vae.add_loss(K.mean(reconstruction_loss + kl_loss))
    vae.compile(optimizer=keras.optimizers.Adam(0.01))
    history = vae.fit(x_train, epochs=25, batch_size=32, verbose=0)
    assert _falls(history, 0.85)
    assert encoder.predict(x_train[:4])[0].shape == (4, latent_dim)


def test_siamese_network_with_a_lambda_distance(keras):
    """examples/mnist_siamese.py: a shared base network, a Lambda Euclidean distance and
    the contrastive loss."""
    layers, K = keras.layers, keras.backend
    rng = np.random.RandomState(4)
    centers = rng.randn(3, 6) * 2
    labels = rng.randint(0, 3, size=(2, 160))
    pairs = (centers[labels] + 0.5 * rng.randn(2, 160, 6)).astype('float32')
    same = (labels[0] == labels[1]).astype('float32')

    def euclidean_distance(vects):
        x, y = vects
        sum_square = K.sum(K.square(x - y), axis=1, keepdims=True)
        return K.sqrt(K.maximum(sum_square, K.epsilon()))

    def eucl_dist_output_shape(shapes):
        shape1, _ = shapes
        return (shape1[0], 1)

    def contrastive_loss(y_true, y_pred):
        margin = 1
        square_pred = K.square(y_pred)
        margin_square = K.square(K.maximum(margin - y_pred, 0))
        return K.mean(y_true * square_pred + (1 - y_true) * margin_square)

    base_input = layers.Input(shape=(6,))
    hidden = layers.Dropout(0.1)(layers.Dense(16, activation='relu')(base_input))
    base_network = keras.models.Model(base_input, layers.Dense(8, activation='relu')(hidden))
    input_a, input_b = layers.Input(shape=(6,)), layers.Input(shape=(6,))
    distance = layers.Lambda(euclidean_distance, output_shape=eucl_dist_output_shape)(
        [base_network(input_a), base_network(input_b)])
    model = keras.models.Model([input_a, input_b], distance)
    model.compile(loss=contrastive_loss, optimizer=keras.optimizers.RMSprop(0.01))
    history = model.fit([pairs[0], pairs[1]], same, batch_size=32, epochs=8, verbose=0)
    assert _falls(history, 0.8)
    predicted = model.predict([pairs[0], pairs[1]]).ravel()
    assert np.mean((predicted < 0.5) == same) > 0.75


def test_stateful_lstm(keras):
    """examples/lstm_stateful.py: a stateful LSTM over consecutive chunks of one long
    series (batch_input_shape, shuffle=False, reset_states between epochs)."""
    layers = keras.layers
    rng = np.random.RandomState(5)
    series = np.cumsum(rng.randn(1200)).astype('float32') * 0.1
    lahead, batch_size, steps = 1, 8, 4
    x = np.stack([series[i:i + steps] for i in range(0, 1024, steps)])[:, :, None]
    y = np.array([series[i + steps - 1:i + steps + lahead - 1].mean() for i in range(0, 1024, steps)])
    model = keras.models.Sequential([
        layers.LSTM(12, batch_input_shape=(batch_size, steps, 1), return_sequences=False,
                    stateful=True),
        layers.Dense(1)])
    model.compile(loss='mse', optimizer=keras.optimizers.Adam(0.01))
    losses = []
    for _ in range(4):
        losses.append(model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0,
                                shuffle=False).history['loss'][0])
        model.reset_states()
    assert losses[-1] < 0.5 * losses[0]
    assert model.predict(x[:batch_size], batch_size=batch_size).shape == (batch_size, 1)


def test_char_lstm_text_generation(keras):
    """examples/lstm_text_generation.py: next-character prediction with an LSTM, then
    sampling a text with a temperature."""
    layers = keras.layers
    text = 'the quick brown fox jumps over the lazy dog. ' * 12
    chars = sorted(set(text))
    char_indices = {c: i for i, c in enumerate(chars)}
    maxlen, step = 8, 2
    sentences = [text[i:i + maxlen] for i in range(0, len(text) - maxlen, step)]
    next_chars = [text[i + maxlen] for i in range(0, len(text) - maxlen, step)]
    x = np.zeros((len(sentences), maxlen, len(chars)), dtype=bool)
    y = np.zeros((len(sentences), len(chars)), dtype=bool)
    for i, sentence in enumerate(sentences):
        for t, char in enumerate(sentence):
            x[i, t, char_indices[char]] = 1
        y[i, char_indices[next_chars[i]]] = 1
    model = keras.models.Sequential([layers.LSTM(32, input_shape=(maxlen, len(chars))),
                                     layers.Dense(len(chars), activation='softmax')])
    model.compile(loss='categorical_crossentropy', optimizer=keras.optimizers.RMSprop(0.02))
    history = model.fit(x, y, batch_size=32, epochs=6, verbose=0)
    assert _falls(history, 0.7)

    def sample(preds, temperature=1.0):
        preds = np.log(np.asarray(preds).astype('float64')) / temperature
        probas = np.random.multinomial(1, np.exp(preds) / np.sum(np.exp(preds)), 1)
        return np.argmax(probas)

    sentence = text[:maxlen]
    generated = ''
    for _ in range(10):
        x_pred = np.zeros((1, maxlen, len(chars)))
        for t, char in enumerate(sentence):
            x_pred[0, t, char_indices[char]] = 1.
        next_char = chars[sample(model.predict(x_pred, verbose=0)[0], 0.5)]
        generated += next_char
        sentence = sentence[1:] + next_char
    assert len(generated) == 10 and set(generated) <= set(chars)


def test_image_ocr_with_ctc_and_blank_samples(keras):
    """examples/image_ocr.py: convolutions, a reshape to time steps, a bidirectional GRU,
    softmax, and the CTC loss computed in a Lambda layer; like the example, some samples
    are blank images labelled with the blank class, length 1."""
    layers, K = keras.layers, keras.backend
    rng = np.random.RandomState(6)
    n, img_w, img_h, absolute_max_string_len = 48, 16, 8, 3
    output_size = 4  # 3 glyphs + the CTC blank
    blank_label = output_size - 1
    glyphs = rng.rand(3, img_h, 4) > 0.5
    images = np.zeros((n, img_w, img_h, 1), 'float32')
    labels = np.full((n, absolute_max_string_len), blank_label, 'float32')
    label_length = np.ones((n, 1), 'float32')
    for i in range(n):
        if i % 8 == 7:
            labels[i, 0] = blank_label  # a blank image, labelled with the blank, length 1
            continue
        word = rng.randint(0, 3, size=rng.randint(1, absolute_max_string_len + 1))
        for j, g in enumerate(word):
            images[i, 1 + 5 * j:5 + 5 * j, :, 0] = glyphs[g].T
        labels[i, :len(word)] = word
        label_length[i] = len(word)
    input_length = np.full((n, 1), img_w // 2 - 2, 'float32')

    input_data = layers.Input(name='the_input', shape=(img_w, img_h, 1), dtype='float32')
    inner = layers.Conv2D(8, (3, 3), padding='same', activation='relu',
                          kernel_initializer='he_normal')(input_data)
    inner = layers.MaxPooling2D(pool_size=(2, 2))(inner)
    inner = layers.Reshape(target_shape=(img_w // 2, (img_h // 2) * 8))(inner)
    inner = layers.Dense(16, activation='relu')(inner)
    gru = layers.Bidirectional(layers.GRU(16, return_sequences=True), merge_mode='concat')(inner)
    y_pred = layers.Activation('softmax', name='softmax')(layers.Dense(output_size)(gru))

    def ctc_lambda_func(args):
        y_pred, labels, input_length, label_length = args
        y_pred = y_pred[:, 2:, :]  # the example drops the first two outputs
        return K.ctc_batch_cost(labels, y_pred, input_length, label_length)

    the_labels = layers.Input(name='the_labels', shape=[absolute_max_string_len], dtype='float32')
    input_length_in = layers.Input(name='input_length', shape=[1], dtype='int64')
    label_length_in = layers.Input(name='label_length', shape=[1], dtype='int64')
    loss_out = layers.Lambda(ctc_lambda_func, output_shape=(1,), name='ctc')(
        [y_pred, the_labels, input_length_in, label_length_in])
    model = keras.models.Model([input_data, the_labels, input_length_in, label_length_in], loss_out)
    model.compile(loss={'ctc': lambda y_true, y_pred: y_pred},
                  optimizer=keras.optimizers.Adam(0.01))
    inputs = {'the_input': images, 'the_labels': labels, 'input_length': input_length,
              'label_length': label_length}
    history = model.fit(inputs, {'ctc': np.zeros(n)}, batch_size=16, epochs=8, verbose=0)
    assert np.all(np.isfinite(history.history['loss']))
    assert _falls(history, 0.6)
