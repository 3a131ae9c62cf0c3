"""A one-cell MyST notebook for the tests that build small copies of the book."""

HEADER = """---
jupytext:
  text_representation: {extension: .md, format_name: myst, format_version: 0.13}
kernelspec: {display_name: Python 3, language: python, name: python3}
---
"""


def probe_notebook(name: str, code: str, parameters: str = "", prose: str = "") -> str:
    """Page "Probe NAME": a parameter cell (`scale: str = "ci"` plus `parameters`, declared `name: TYPE = value`), one code cell, then `prose`."""
    params = 'scale: str = "ci"\n' + parameters
    return (f"{HEADER}\n# Probe {name}\n\n```{{code-cell}} ipython3\n:tags: [parameters]\n\n{params}```\n\n"
            f"```{{code-cell}} ipython3\n{code}\n```\n" + (f"\n{prose}\n" if prose else ""))
