"""The test oracle for float8 block-quantized targets, in PyTorch and apart from the
agents' CUDA kernel: used by the GPU suite and the sync benchmark's checks."""

import torch


def reference_float8(values):
    """The block quantizer as the tests define it, in PyTorch: per 128 x 128 block,
    scale = amax / 448 (amax over the finite values; 1 for an all-zero block), values /
    scale rounded to nearest even float8_e4m3fn, saturated (infinities too; NaN stays
    NaN). Returns (float8 tensor, float32 scales)."""
    rows, cols = values.shape
    blocks = ((rows + 127) // 128, (cols + 127) // 128)
    padded = torch.zeros(blocks[0] * 128, blocks[1] * 128, dtype=torch.float32, device=values.device)
    padded[:rows, :cols] = values.float()
    finite = torch.where(padded.isfinite(), padded.abs(), torch.zeros_like(padded))
    amax = finite.view(blocks[0], 128, blocks[1], 128).amax(dim=(1, 3))
    # Divided by a tensor: PyTorch divides by a Python number as a multiplication by its
    # reciprocal, which is not amax / 448 in float32 for every amax.
    scales = torch.where(amax > 0, amax / torch.full_like(amax, 448.0), torch.ones_like(amax))
    spread = scales.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    return (values.float() / spread).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scales
