"""Writes brevitas_qcdq.onnx (needs torch and brevitas 0.13, which finnlite does not depend on): a small CNN exported
with Brevitas' export_onnx_qcdq — an 8-bit input quantizer, 4-bit weights (QuantizeLinear → Clip →
DequantizeLinear), BatchNorm and a 4-bit ReLU, MaxPool and a 4-bit linear layer."""

import onnx
import torch
import torch.nn as nn

import brevitas.nn as qnn
from brevitas.export import export_onnx_qcdq

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = qnn.QuantIdentity(bit_width=8, return_quant_tensor=True)
        self.conv = qnn.QuantConv2d(3, 8, 3, padding=1, weight_bit_width=4, bias=False, return_quant_tensor=True)
        self.bn = nn.BatchNorm2d(8)
        self.relu = qnn.QuantReLU(bit_width=4, return_quant_tensor=True)
        self.pool = nn.MaxPool2d(2)
        self.fc = qnn.QuantLinear(8 * 4 * 4, 10, bias=False, weight_bit_width=4)

    def forward(self, x):
        x = self.relu(self.bn(self.conv(self.inp(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


model = Net().eval()
with torch.no_grad():
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2)
    model(torch.randn(4, 3, 8, 8))
export_onnx_qcdq(model, torch.randn(1, 3, 8, 8), export_path="brevitas_qcdq.onnx")
onnx.save(onnx.load("brevitas_qcdq.onnx"), "brevitas_qcdq.onnx", save_as_external_data=False)  # one file
