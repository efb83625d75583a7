"""ResNet-50 for each framework: plain torch, and Keras's own ResNet50 for TensorFlow/Keras."""
