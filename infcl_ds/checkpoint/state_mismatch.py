"""A checkpoint's weights that do not fit the model, said in one line.

torch's ``load_state_dict`` error lists every missing key and every mismatched shape (dozens
of lines for a changed model); the line that reports it counts each kind and names the first.
"""
import re


def _keys(text: str, label: str):
    found = re.search(label + r" key\(s\) in state_dict: (.*?)\.\s*(?:\n|$)", text)
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def summarize(err: BaseException) -> str:
    """``3 shapes differ (first: visual.proj: [32, 32] saved, [64, 64] here); 12 keys missing
    (first: ...)``; for another error its first line, bounded."""
    text = str(err)
    sizes = re.findall(r"size mismatch for ([^:]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) from "
                       r"checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)", text)
    missing, unexpected = _keys(text, "Missing"), _keys(text, "Unexpected")
    parts = []
    if sizes:
        name, saved, here = sizes[0]
        parts.append(f"{len(sizes)} shape(s) differ (first: {name}: [{saved}] saved, [{here}] here)")
    if missing:
        parts.append(f"{len(missing)} key(s) missing from the checkpoint (first: {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} key(s) the model does not have (first: {unexpected[0]})")
    if parts:
        return "; ".join(parts)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first if len(first) <= 300 else f"{first[:300]}... ({len(first):,} characters)"
