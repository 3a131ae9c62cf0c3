"""An author-year bibliography: entries labelled "Galanti et al., 2022" (as the text cites them, with
`bibtex_reference_style: author_year`) instead of "[GSGP22]", sorted by author and year; arXiv ids
and DOIs link to arxiv.org and doi.org (pybtex's unsrt style does that from `eprint` and `doi`).

Used by `bibtex_default_style: authoryear` in _config.yml.
"""

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle


def _last(person) -> str:
    return " ".join(person.last_names).replace("{", "").replace("}", "")


class AuthorYearLabels(BaseLabelStyle):
    """"Roy and Vetterli, 2007", "Galanti et al., 2022"; a letter is appended to repeated labels by pybtex."""

    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            people = entry.persons.get("author") or entry.persons.get("editor") or []
            if not people:
                names = entry.key
            elif len(people) == 1:
                names = _last(people[0])
            elif len(people) == 2:
                names = f"{_last(people[0])} and {_last(people[1])}"
            else:
                names = f"{_last(people[0])} et al."
            yield f"{names}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(UnsrtStyle):
    default_label_style = AuthorYearLabels
    default_sorting_style = SortingStyle


def setup(app):
    register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
