"""Red-team answers for unit 16 (FP8 quantization): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited

_SCALE = "tiles.abs().amax(dim=2).clamp(min=1e-12) / 448.0"


def _act(scale):
    return edited("16", "quantize_act_tiles", (_SCALE, scale))


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
    Answer("16.quantize_blockwise", "scale from the mean |x| of the tile", _act(
        "tiles.abs().mean(dim=2).clamp(min=1e-12) * 4 / 448.0"), bug="B16.scale_from_mean",
        origin="issue 39"),
    Answer("16.quantize_blockwise", "scale from three standard deviations", _act(
        "(3 * tiles.std(dim=2)).clamp(min=1e-12) / 448.0"), bug="B16.scale_from_sigma",
        origin="issue 39"),
    Answer("16.quantize_blockwise", "no floor: an all-zero tile divides by zero", _act(
        "tiles.abs().amax(dim=2) / 448.0"), says=r"zero|finite|nan|expected"),
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
    Answer("16.fp8_blockwise_matmul", "acc_bits rounding applied after the scales", '''
def fp8_blockwise_matmul(qa, sa, qw, sw, chunk=128, acc_bits=None):
    from llmcourse.quant.fp8 import round_mantissa

    M, K = qa.shape
    N = qw.shape[0]
    wrow = sw.float().repeat_interleave(chunk, dim=0)[:N]
    y = torch.zeros(M, N)
    for c in range(math.ceil(K / chunk)):
        cols = slice(c * chunk, min(K, (c + 1) * chunk))
        part = (qa[:, cols].float() @ qw[:, cols].float().T) * sa[:, c].float().unsqueeze(1) * wrow[:, c]
        if acc_bits is not None:
            part = round_mantissa(part, acc_bits).float()
        y += part
    return y
''', says=r"acc|round|expected|scale"),
    Answer("16.fp8_blockwise_matmul", "acc_bits ignored", '''
_mm = fp8_blockwise_matmul


def fp8_blockwise_matmul(qa, sa, qw, sw, chunk=128, acc_bits=None):
    return _mm(qa, sa, qw, sw, chunk)
''', says=r"acc|round|expected"),
    # -- 16.FP8Linear -------------------------------------------------------------------------------------------
    Answer("16.FP8Linear", "forward dequantises the weight and skips activation quantisation", '''
class FP8Linear(FP8Linear):
    def forward(self, x):
        w = dequantize_weight_blocks(self.weight_fp8, self.weight_scale, self.block)
        return torch.nn.functional.linear(x.float(), w, self.bias)
''', says=r"activation|tile|quantis|expected"),
    Answer("16.FP8Linear", "the FP8 weight kept as a frozen parameter", '''
class FP8Linear(FP8Linear):
    def __init__(self, in_features, out_features, bias=True, block=128):
        super().__init__(in_features, out_features, bias, block)
        w = self.weight_fp8
        del self._buffers["weight_fp8"]
        self.weight_fp8 = nn.Parameter(w, requires_grad=False)
''', says=r"buffer|parameter"),
    Answer("16.FP8Linear", "activation tiles as wide as the whole row", '''
class FP8Linear(FP8Linear):
    def forward(self, x):
        rows = x.reshape(-1, self.in_features).float()
        qa, sa = quantize_act_tiles(rows, self.in_features)
        y = dequantize_act_tiles(qa, sa, self.in_features) @ dequantize_weight_blocks(
            self.weight_fp8, self.weight_scale, self.block).T
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)
''', says=r"tile|block|activation|expected"),
    # -- 16.convert_linears_to_fp8 ------------------------------------------------------------------------------
    Answer("16.convert_linears_to_fp8", "skip matched against the full dotted name", '''
def convert_linears_to_fp8(model, skip=("lm_head", "gate")):
    for name, mod in list(model.named_modules()):
        if type(mod) is nn.Linear and name not in skip:
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], FP8Linear.from_linear(mod))
    return model
''', says=r"gate|skip|expected|name"),
    Answer("16.convert_linears_to_fp8", "the tie recognised by the name lm_head only", '''
def convert_linears_to_fp8(model, skip=("lm_head", "gate")):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and name not in skip and name != "lm_head":
                setattr(parent, name, FP8Linear.from_linear(child))
    return model
''', says=r"tie|tied|embed|share"),
    Answer("16.convert_linears_to_fp8", "tied layers kept only when skip names them", '''
def convert_linears_to_fp8(model, skip=("lm_head", "gate")):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and name not in skip:
                setattr(parent, name, FP8Linear.from_linear(child))
    return model
''', says=r"tie|tied|embed|share"),
]
