"""Unit 01's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_DS_OK_INIT = '''
class GPTWindowDataset(Dataset):
    def __init__(self, token_ids, context_length, stride):
        self.ids = torch.as_tensor(token_ids, dtype=torch.long)
        self.L, self.stride = context_length, stride
        self.n = (len(self.ids) - context_length - 1) // stride + 1
        if len(self.ids) < context_length + 1:
            raise ValueError("too few tokens for one window")

    def __len__(self):
        return self.n
'''

ANSWERS = [
    # -- 01.CharTokenizer ------------------------------------------------------------------------------------
    Answer("01.CharTokenizer", "__init__ sorts the given chars (ids are no longer positions in chars)", '''
class CharTokenizer:
    def __init__(self, chars):
        self.chars = sorted(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text):
        return cls(set(text))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, s):
        for c in s:
            if c not in self.stoi:
                raise ValueError(f"unknown character {c!r}")
        return [self.stoi[c] for c in s]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)
''', says=r"position|chars|id"),
    Answer("01.CharTokenizer", "unknown characters raise KeyError from the dict lookup", '''
class CharTokenizer:
    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, s):
        return [self.stoi[c] for c in s]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)
''', says=r"ValueError"),
    Answer("01.CharTokenizer", "vocabulary in order of first appearance", '''
class CharTokenizer:
    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text):
        return cls(dict.fromkeys(text))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, s):
        for c in s:
            if c not in self.stoi:
                raise ValueError(f"unknown character {c!r}")
        return [self.stoi[c] for c in s]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)
''', bug="B01.char_vocab_unsorted"),
    # -- 01.bpe_train ----------------------------------------------------------------------------------------
    Answer("01.bpe_train", "pairs counted once per distinct word (count ignored)", '''
def bpe_train(word_counts, num_merges, end_of_word="</w>"):
    words = {w: list(w) + [end_of_word] for w in word_counts}
    merges = []
    for _ in range(num_merges):
        counts = Counter()
        for syms in words.values():
            for a, b in zip(syms, syms[1:]):
                counts[(a, b)] += 1
        if not counts:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)
        merges.append(pair)
        for w, syms in words.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return merges
''', bug="B01.unweighted_counts"),
    Answer("01.bpe_train", "merge by str.replace on space-joined symbols (matches across symbol boundaries)", '''
def bpe_train(word_counts, num_merges, end_of_word="</w>"):
    words = {" ".join(list(w) + [end_of_word]): c for w, c in word_counts.items()}
    merges = []
    for _ in range(num_merges):
        counts = Counter()
        for w, c in words.items():
            syms = w.split(" ")
            for a, b in zip(syms, syms[1:]):
                counts[(a, b)] += c
        if not counts:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)
        merges.append(pair)
        words = {w.replace(" ".join(pair), "".join(pair)): c for w, c in words.items()}
    return merges
''', says=r"not an adjacent pair|had count"),
    Answer("01.bpe_train", "ties broken by the first pair counted (Counter.most_common)", '''
def bpe_train(word_counts, num_merges, end_of_word="</w>"):
    words = {w: list(w) + [end_of_word] for w in sorted(word_counts)}
    merges = []
    for _ in range(num_merges):
        counts = Counter()
        for w, syms in words.items():
            for a, b in zip(syms, syms[1:]):
                counts[(a, b)] += word_counts[w]
        if not counts:
            break
        pair = counts.most_common(1)[0][0]
        merges.append(pair)
        for w, syms in words.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return merges
''', bug="B01.tie_first_seen"),
    Answer("01.bpe_train", "end-of-word marker hard-coded", '''
def bpe_train(word_counts, num_merges, end_of_word="</w>"):
    words = {w: list(w) + ["</w>"] for w in word_counts}
    merges = []
    for _ in range(num_merges):
        counts = Counter()
        for w, syms in words.items():
            for a, b in zip(syms, syms[1:]):
                counts[(a, b)] += word_counts[w]
        if not counts:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)
        merges.append(pair)
        for w, syms in words.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return merges
''', bug="B01.marker_hard_coded"),
    # -- 01.bpe_encode_word ----------------------------------------------------------------------------------
    Answer("01.bpe_encode_word", "merges applied once each, in list order (one pass)", '''
def bpe_encode_word(word, merges, end_of_word="</w>"):
    syms = list(word) + [end_of_word]
    for pair in merges:
        out, i = [], 0
        while i < len(syms):
            if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                out.append(syms[i] + syms[i + 1])
                i += 2
            else:
                out.append(syms[i])
                i += 1
        syms = out
    return syms
''', bug="B01.encode_one_pass"),
    Answer("01.bpe_encode_word", "end-of-word marker hard-coded", '''
def bpe_encode_word(word, merges, end_of_word="</w>"):
    rank = {p: r for r, p in enumerate(merges)}
    syms = list(word) + ["</w>"]
    while True:
        pairs = [(rank[p], p) for p in zip(syms, syms[1:]) if p in rank]
        if not pairs:
            return syms
        _, pair = min(pairs)
        out, i = [], 0
        while i < len(syms):
            if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                out.append(syms[i] + syms[i + 1])
                i += 2
            else:
                out.append(syms[i])
                i += 1
        syms = out
''', bug="B01.marker_hard_coded"),
    Answer("01.bpe_encode_word", "the first mergeable pair in the word, not the lowest rank", '''
def bpe_encode_word(word, merges, end_of_word="</w>"):
    known = set(merges)
    syms = list(word) + [end_of_word]
    while True:
        pair = next((p for p in zip(syms, syms[1:]) if p in known), None)
        if pair is None:
            return syms
        out, i = [], 0
        while i < len(syms):
            if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                out.append(syms[i] + syms[i + 1])
                i += 2
            else:
                out.append(syms[i])
                i += 1
        syms = out
''', bug="B01.encode_in_scan_order"),
    # -- 01.load_gpt2_encoding -------------------------------------------------------------------------------
    Answer("01.load_gpt2_encoding", "path ignored (always the course's copy)", '''
def load_gpt2_encoding(path=None):
    import tiktoken.load
    ranks = tiktoken.load.load_tiktoken_bpe(str(llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")))
    pat = r"""'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    return tiktoken.Encoding(name="gpt2", pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})
''', says=r"path"),
    Answer("01.load_gpt2_encoding", "a simplified pre-tokenisation pattern (words and spaces)", '''
def load_gpt2_encoding(path=None):
    import tiktoken.load
    if path is None:
        path = llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")
    ranks = tiktoken.load.load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(name="gpt2", pat_str=r""" ?\\w+| ?[^\\w\\s]+|\\s+""", mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})
''', says=r"the-verdict must encode|encode\("),
    # -- 01.GPTWindowDataset ---------------------------------------------------------------------------------
    Answer("01.GPTWindowDataset", "ids not forced to torch.long (an int32 input stays int32)", '''
class GPTWindowDataset(Dataset):
    def __init__(self, token_ids, context_length, stride):
        self.ids = torch.as_tensor(token_ids)
        self.L, self.stride = context_length, stride
        if len(self.ids) < context_length + 1:
            raise ValueError("too few tokens for one window")

    def __len__(self):
        return (len(self.ids) - self.L - 1) // self.stride + 1

    def __getitem__(self, i):
        s = i * self.stride
        return self.ids[s:s + self.L], self.ids[s + 1:s + self.L + 1]
''', says=r"long|int64|dtype", origin="issue 37"),
    Answer("01.GPTWindowDataset", "stride ignored in __getitem__ (window i starts at i)", _DS_OK_INIT + '''
    def __getitem__(self, i):
        return self.ids[i:i + self.L], self.ids[i + 1:i + self.L + 1]
''', bug="B01.stride_ignored"),
    Answer("01.GPTWindowDataset", "create_dataloader seeds the global RNG instead of a generator", '''
def create_dataloader(token_ids, batch_size, context_length, stride, shuffle=True, drop_last=True, seed=0):
    torch.manual_seed(seed)
    ds = GPTWindowDataset(token_ids, context_length, stride)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=0)
''', bug="B01.loader_global_seed"),
    Answer("01.GPTWindowDataset", "drop_last ignored (always True)", '''
def create_dataloader(token_ids, batch_size, context_length, stride, shuffle=True, drop_last=True, seed=0):
    ds = GPTWindowDataset(token_ids, context_length, stride)
    g = torch.Generator().manual_seed(seed)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=True, generator=g)
''', says=r"drop_last"),
]
