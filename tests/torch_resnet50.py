"""ResNet-50 for the tests: ``dpcost.torch_models``' torch.nn builder (torchvision's v1.5
layout; torchvision is not installed here), kept under this name for the tests that import it."""

from dpcost.torch_models import Bottleneck, resnet50  # noqa: F401
