"""Horovod ResNet-50 training for PyTorch, TensorFlow 2 and Keras, with one shared command line.

Entry points: ``python -m dtjob_train.pytorch``, ``python -m dtjob_train.tensorflow``,
``python -m dtjob_train.keras``.
"""
