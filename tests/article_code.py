"""The articles' own model code, copied as the articles print it: the spec our models must match."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torchvision import models


def article_vgg16() -> nn.Sequential:
    """First article: the VGG16 Sequential, line for line."""
    vgg16 = models.vgg16()
    vgg_layers_list = list(vgg16.children())[:-1]
    vgg_layers_list.append(nn.Flatten())
    vgg_layers_list.append(nn.Linear(25088, 4096))
    vgg_layers_list.append(nn.ReLU())
    vgg_layers_list.append(nn.Dropout(0.5, inplace=False))
    vgg_layers_list.append(nn.Linear(4096, 4096))
    vgg_layers_list.append(nn.ReLU())
    vgg_layers_list.append(nn.Dropout(0.5, inplace=False))
    vgg_layers_list.append(nn.Linear(4096, 2))
    return nn.Sequential(*vgg_layers_list)


def conv_bn_relu(in_ch, out_ch, ker_sz, stride, pad):
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, ker_sz, stride, pad, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(),
    )


class ArticleNetA(nn.Module):
    """Second article's NetA (``use_reentrant`` made explicit, as torch now asks)."""

    def __init__(self, use_checkpoint=False):
        super().__init__()
        self.use_checkpoint = use_checkpoint
        k = 2
        self.layer1 = conv_bn_relu(3, 32 * k, 3, 1, 1)
        self.layer2 = conv_bn_relu(32 * k, 32 * k, 3, 2, 1)
        self.layer3 = conv_bn_relu(32 * k, 64 * k, 3, 1, 1)
        self.layer4 = conv_bn_relu(64 * k, 64 * k, 3, 2, 1)
        self.layer5 = conv_bn_relu(64 * k, 128 * k, 3, 1, 1)
        self.layer6 = conv_bn_relu(128 * k, 128 * k, 3, 2, 1)
        self.layer7 = conv_bn_relu(128 * k, 256 * k, 3, 1, 1)
        self.layer8 = conv_bn_relu(256 * k, 256 * k, 3, 2, 1)
        self.layer9 = nn.Linear(256 * k, 10)

    def seg0(self, y):
        return self.layer1(y)

    def seg1(self, y):
        return self.layer3(self.layer2(y))

    def seg2(self, y):
        return self.layer5(self.layer4(y))

    def seg3(self, y):
        return self.layer7(self.layer6(y))

    def seg4(self, y):
        y = self.layer8(y)
        y = F.adaptive_avg_pool2d(y, 1)
        y = torch.flatten(y, 1)
        return self.layer9(y)

    def forward(self, x):
        y = x + torch.zeros(1, dtype=x.dtype, device=x.device, requires_grad=True)
        for seg in (self.seg0, self.seg1, self.seg2, self.seg3, self.seg4):
            y = checkpoint(seg, y, use_reentrant=True) if self.use_checkpoint else seg(y)
        return y
