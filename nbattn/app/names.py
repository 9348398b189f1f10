"""Column names on the command line and in messages: ``--features`` / ``--drop`` lists
(:func:`split_columns`, read back by :func:`column_option`), names checked against a file's
columns with the nearest ones suggested (:func:`check_columns`), and cells and names quoted
in an error message on one readable line (:func:`shorten`, :func:`clip`).
:mod:`nbattn.app.io` re-exports them."""

from __future__ import annotations

import shlex

from .._core.validation import shown

__all__ = ["check_columns", "clip", "column_option", "shorten", "split_columns"]


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 30, 10)]}...{text[-8:]} ({len(text)} characters)"


def shorten(value, limit: int = 60) -> str:
    """``repr(value)`` (a NumPy scalar's as the Python value's: :func:`shown`) clipped to
    about ``limit`` characters: a cell or a name quoted in an error message, which must
    stay one readable line whatever the file holds."""
    return clip(shown(value), limit)


def split_columns(text: str) -> list[str]:
    """The column names of an option's value (``--features``, ``--drop``): separated by
    commas, the spaces around each name ignored; a name in double quotes is kept as it is
    (a comma, spaces at its ends; ``""`` stands for a quote in it). Empty names between
    commas are skipped; an unclosed quote, or text after a closing one, is a ValueError."""
    names, i, n = [], 0, len(text)
    while i <= n:
        j = i
        while j < n and text[j].isspace():
            j += 1
        if j < n and text[j] == '"':
            k, name = j + 1, []
            while True:
                if k >= n:
                    raise ValueError(f"the quote at character {j + 1} of {text!r} is not closed")
                if text.startswith('""', k):
                    name.append('"')
                    k += 2
                elif text[k] == '"':
                    break
                else:
                    name.append(text[k])
                    k += 1
            k += 1
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] != ",":
                raise ValueError(f"{text!r}: a comma must follow the quoted name {''.join(name)!r}")
            names.append("".join(name))
        else:
            k = text.find(",", j)
            k = n if k < 0 else k
            if text[j:k].strip():
                names.append(text[j:k].strip())
        i = k + 1
    return names


def column_option(name) -> str:
    """A column's name as :func:`split_columns` reads it back: in double quotes when it
    holds a comma or a quote or begins or ends with a space (or is empty), else as it is."""
    name = str(name)
    if name == "" or "," in name or '"' in name or name != name.strip():
        return '"' + name.replace('"', '""') + '"'
    return name


def check_columns(path, columns, wanted, what="column", spell=column_option) -> None:
    """ValueError naming the first of ``wanted`` that is not in ``columns``, with the
    columns whose names are nearest (the same but for case, spaces at the ends or Unicode
    normalization, else one holding it between commas, else alike; never one of
    ``wanted``, which is in use already) as the option would spell them: ``spell`` (a
    list option's :func:`column_option`; ``str`` for an option of one name), quoted for
    the shell. A name that differs from a column only in its Unicode normalization (an
    accent typed as a letter and a combining mark) is said to, as the two look alike."""
    missing = [c for c in wanted if c not in columns]
    if missing:
        import difflib
        import unicodedata

        def nfc(name):
            return unicodedata.normalize("NFC", str(name))

        def key(name):
            return nfc(name).strip().casefold()

        listed = ", ".join(shorten(c) for c in columns[:20])
        more = " ..." if len(columns) > 20 else ""
        bad = str(missing[0])
        free = [c for c in columns if c not in wanted]
        same = [c for c in free if nfc(c) == nfc(bad)]
        if same:
            raise ValueError(
                f"{path}: {what} {ascii(bad)} not found: the column {ascii(str(same[0]))} "
                "looks the same but is written with other Unicode characters (an accent as a "
                "letter of its own or as a combining mark); copy the name from the file"
            )
        near = [c for c in free if key(c) == key(bad)]
        pieces = {c: [p.strip() for p in str(c).split(",")] for c in free if "," in str(c)}
        near = near or [c for c, parts in pieces.items() if bad.strip() in parts]
        near = near or difflib.get_close_matches(bad, [str(c) for c in free], n=3)
        hint = ""
        if near:
            spelled = " or ".join(shlex.quote(spell(c)) for c in near)
            hint = f" (did you mean {spelled}?)"
        raise ValueError(
            f"{path}: {what} {shorten(missing[0])} not found{hint}; the columns are {listed}{more}"
        )
