"""Red-team answers for unit 16 (FP8 quantization): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "16"
ACT_SCALE = "tiles.abs().amax(dim=2).clamp(min=1e-12) / 448.0"
ACT_MATMUL = ("        qa, sa = quantize_act_tiles(rows, self.block)\n"
              "        y = fp8_blockwise_matmul(qa, sa, self.weight_fp8, self.weight_scale, self.block)\n")
KEEP = "name not in skip and uses[child.weight.data_ptr()] == 1"


ANSWERS = [
    # -- 16.fp8_info --------------------------------------------------------------------------------------------
    Answer("16.fp8_info", "eps as half the gap (unit roundoff)", '''
_info = fp8_info


def fp8_info(dtype):
    d = dict(_info(dtype))
    d["eps"] = d["eps"] / 2
    return d
''', says=r"eps|expected"),
    Answer("16.fp8_info", "smallest normal 2^-bias (exponent field 0 taken as normal)", '''
_info2 = fp8_info


def fp8_info(dtype):
    d = dict(_info2(dtype))
    d["min_normal"] = 2.0 ** -d["bias"]
    return d
''', says=r"min_normal|normal|expected"),
    Answer("16.fp8_info", "E4M3's max as if IEEE (top exponent reserved)", '''
_info3 = fp8_info


def fp8_info(dtype):
    d = dict(_info3(dtype))
    if dtype == torch.float8_e4m3fn:
        d["max"] = 240.0
    return d
''', says=r"max|expected"),
    # -- 16.quantize_blockwise ----------------------------------------------------------------------------------
    Answer("16.quantize_blockwise", "scale from the mean |x| of the tile", edited(U, "quantize_act_tiles",
           (ACT_SCALE, "tiles.abs().mean(dim=2).clamp(min=1e-12) * 4 / 448.0")), bug="B16.scale_from_mean",
        origin="issue 39"),
    Answer("16.quantize_blockwise", "scale from three standard deviations", edited(U, "quantize_act_tiles",
           (ACT_SCALE, "(3 * tiles.std(dim=2)).clamp(min=1e-12) / 448.0")), bug="B16.scale_from_sigma",
        origin="issue 39"),
    Answer("16.quantize_blockwise", "no floor: an all-zero tile divides by zero", edited(U, "quantize_act_tiles",
           (ACT_SCALE, "tiles.abs().amax(dim=2) / 448.0")), says=r"zero|finite|nan|expected"),
    Answer("16.quantize_blockwise", "scales stored as their reciprocals (q = x * s)", '''
_qa, _qw = quantize_act_tiles, quantize_weight_blocks


def quantize_act_tiles(x, tile=128):
    q, s = _qa(x, tile)
    return q, 1.0 / s


def quantize_weight_blocks(w, block=128):
    q, s = _qw(w, block)
    return q, 1.0 / s


_da, _dw = dequantize_act_tiles, dequantize_weight_blocks


def dequantize_act_tiles(q, s, tile=128):
    return _da(q, 1.0 / s, tile)


def dequantize_weight_blocks(q, s, block=128):
    return _dw(q, 1.0 / s, block)
''', says=r"scale|s |expected|x.hat|round trip"),
    # -- 16.fp8_blockwise_matmul --------------------------------------------------------------------------------
    Answer("16.fp8_blockwise_matmul", "dequantise both matrices, then one float32 matmul", '''
def fp8_blockwise_matmul(qa, sa, qw, sw, chunk=128, acc_bits=None):
    return dequantize_act_tiles(qa, sa, chunk) @ dequantize_weight_blocks(qw, sw, chunk).T
''', says=r"chunk|dequantis|acc|partial|expected"),
    Answer("16.fp8_blockwise_matmul", "acc_bits rounding applied after the scales", edited(U, "fp8_blockwise_matmul",
           ("part = qa[:, cols].float() @ qw[:, cols].float().T",
            "part = (qa[:, cols].float() @ qw[:, cols].float().T) * sa[:, c].float().unsqueeze(1) "
            "* w_scale_per_row[:, c]"),
           ("y += part * sa[:, c].float().unsqueeze(1) * w_scale_per_row[:, c].unsqueeze(0)", "y += part")),
           says=r"acc|round|expected|scale"),
    Answer("16.fp8_blockwise_matmul", "acc_bits ignored", '''
_mm = fp8_blockwise_matmul


def fp8_blockwise_matmul(qa, sa, qw, sw, chunk=128, acc_bits=None):
    return _mm(qa, sa, qw, sw, chunk)
''', says=r"acc|round|expected"),
    # -- 16.FP8Linear -------------------------------------------------------------------------------------------
    Answer("16.FP8Linear", "forward dequantises the weight and skips activation quantisation", edited(U, "FP8Linear",
           ("        rows = x.reshape(-1, self.in_features)\n" + ACT_MATMUL
            + "        if self.bias is not None:\n            y = y + self.bias\n"
              "        return y.reshape(*x.shape[:-1], self.out_features)",
            "        w = dequantize_weight_blocks(self.weight_fp8, self.weight_scale, self.block)\n"
            "        return torch.nn.functional.linear(x.float(), w, self.bias)")), says=r"activation|tile|quantis|expected"),
    Answer("16.FP8Linear", "the FP8 weight kept as a frozen parameter", '''
class FP8Linear(FP8Linear):
    def __init__(self, in_features, out_features, bias=True, block=128):
        super().__init__(in_features, out_features, bias, block)
        w = self.weight_fp8
        del self._buffers["weight_fp8"]
        self.weight_fp8 = nn.Parameter(w, requires_grad=False)
''', says=r"buffer|parameter"),
    Answer("16.FP8Linear", "activation tiles as wide as the whole row", edited(U, "FP8Linear",
           (ACT_MATMUL, "        qa, sa = quantize_act_tiles(rows.float(), self.in_features)\n"
                        "        y = dequantize_act_tiles(qa, sa, self.in_features) @ dequantize_weight_blocks(\n"
                        "            self.weight_fp8, self.weight_scale, self.block).T\n")), says=r"tile|block|activation|expected"),
    # -- 16.convert_linears_to_fp8 ------------------------------------------------------------------------------
    Answer("16.convert_linears_to_fp8", "skip matched against the full dotted name", edited(U, "convert_linears_to_fp8",
           ("    for parent in model.modules():\n        for name, child in parent.named_children():\n"
            f"            if type(child) is nn.Linear and {KEEP}:\n"
            "                replace.append((parent, name, child))\n",
            "    for full, child in model.named_modules():\n"
            f"        if type(child) is nn.Linear and {KEEP.replace('name not', 'full not')}:\n"
            '            parent = model.get_submodule(full.rsplit(".", 1)[0]) if "." in full else model\n'
            '            replace.append((parent, full.rsplit(".", 1)[-1], child))\n')), says=r"gate|skip|expected|name"),
    Answer("16.convert_linears_to_fp8", "the tie recognised by the name lm_head only", edited(U, "convert_linears_to_fp8",
           (KEEP, 'name not in skip and name != "lm_head"')), says=r"tie|tied|embed|share"),
    Answer("16.convert_linears_to_fp8", "tied layers kept only when skip names them", edited(U, "convert_linears_to_fp8", (KEEP, "name not in skip")), says=r"tie|tied|embed|share"),
]
