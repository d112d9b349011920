"""Between processes: the frame codec, ZeroMQ channels, weight streaming, CURVE keys."""
