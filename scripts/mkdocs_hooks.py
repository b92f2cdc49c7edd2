"""mkdocs hooks (mkdocs.yml `hooks:`): every citation of the science spec
(`SCIENCE.md D.1`, bare D.x/G.x) becomes a link to its section's anchor in
docs/science/SCIENCE.md, and the papers' arXiv ids links to their abstracts.
The citations themselves are checked by scripts/spec_refs.py (docs tier)."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_refs  # noqa: E402

_IDS = spec_refs.anchors()
_ARXIV = re.compile(r"(?<![\w./])(2607\.11875|2605\.03780|2511\.01033)(?![\w])")


def on_page_markdown(markdown, page, config, files, **kwargs):
    here = os.path.dirname(page.file.src_path)
    spec = os.path.relpath("science/SCIENCE.md", here or ".").replace(os.sep, "/")
    if page.file.src_path.replace(os.sep, "/") == "science/SCIENCE.md":
        spec = ""
    markdown = spec_refs.linkify(markdown, spec, _IDS)
    spans = spec_refs._code_mask(markdown)
    for m in reversed(list(_ARXIV.finditer(markdown))):
        if not spec_refs._inside(m.start(), spans):
            markdown = (markdown[:m.start()] + f"[{m.group(1)}](https://arxiv.org/abs/{m.group(1)})" +
                        markdown[m.end():])
    return markdown
