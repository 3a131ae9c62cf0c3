"""Drop repeated <script> entries from every page.

Jupyter Book 1.0.4 initialises sphinx-thebe (and togglebutton) twice, once with filename `''` and
once with `None`, so each page declares `const THEBE_JS_URL` twice and the browser raises
"Identifier 'THEBE_JS_URL' has already been declared". Inline scripts are keyed by their body.
"""


def _dedupe(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files", [])
    seen, kept = set(), []
    for js in scripts:
        body = (getattr(js, "attributes", None) or {}).get("body")
        key = ("body", body) if body else ("file", str(getattr(js, "filename", js)))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept


def setup(app):
    app.connect("html-page-context", _dedupe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
