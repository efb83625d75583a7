"""dtjob: a Kubernetes operator that runs distributed Horovod training on AKS GPU node pools."""

__version__ = "0.1.0"
API_GROUP = "dtjob.io"
API_VERSION = "v1alpha1"
KIND = "DistributedTrainingJob"
PLURAL = "distributedtrainingjobs"
