"""The command line's argument types and help formatter: JSON objects, repeatable key=value and NAME=PATH flags,
and help that ends every optional flag with its default. Standard library only; cli_arguments.py builds the
parser with them and the benchmarks format their help with DescribedDefaultsShown.
"""

from __future__ import annotations

import argparse
import json


def json_object(text: str) -> dict:
    """A flag's JSON object (--backbone-spec, --hparams, --candidates), refused with the reason otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def yes_or_no(text: str) -> bool:
    """A switch the workflow passes with its value (--replace-release no), so that the command's text stays the same
    whichever it is."""
    words = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
    if text.lower() not in words:
        raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")
    return words[text.lower()]


class KeyValues(argparse.Action):
    """Repeatable key=value into one dict; a value is read as JSON where it parses (0.3, true, "x"), else as text."""

    def __call__(self, parser, namespace, value, option_string=None):

        if "=" not in value:
            parser.error(f"{option_string} expects key=value, got {value!r}")
        key, raw = value.split("=", 1)
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), key: parsed})


class NamedPaths(argparse.Action):
    """NAME=PATH items into {name: path} (the name may hold '=', the path not)."""

    def __call__(self, parser, namespace, values, option_string=None):
        named = dict(getattr(namespace, self.dest) or {})
        for item in values if isinstance(values, list) else [values]:
            name, separator, path = item.rpartition("=")
            if not separator or not name:
                parser.error(f"{option_string} {item!r}: expected NAME=PATH")
            named[name] = path
        setattr(namespace, self.dest, named)


class NamedGroups(argparse.Action):
    """NAME=CLASS[,CLASS...] items into {name: [class, ...]}."""

    def __call__(self, parser, namespace, value, option_string=None):
        name, separator, classes = value.partition("=")
        listed = [c for c in classes.split(",") if c]
        if not separator or not name or not listed:
            parser.error(f"{option_string} {value!r}: expected NAME=CLASS[,CLASS...] naming at least one class")
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), name: listed})


class DefaultsShown(argparse.HelpFormatter):
    """Every optional flag's help ends with its default, so `--help` alone tells what a bare call does. Prose is
    wrapped to the terminal; a paragraph with indented lines (the command listing, an example) is printed as
    written, so an example stays one command to copy."""

    def _fill_text(self, text, width, indent):
        fill = super()._fill_text
        return "\n\n".join(paragraph if paragraph.startswith(" ") or "\n " in paragraph
                           else fill(paragraph, width, indent) for paragraph in text.split("\n\n"))

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            shown = "on" if action.default else "off"
        elif action.default is None or action.default == []:
            shown = "none"
        elif action.default == "":
            shown = "empty"
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class DescribedDefaultsShown(argparse.RawDescriptionHelpFormatter, DefaultsShown):
    """The benchmarks' help: their module docstring verbatim, then every flag with its default."""


# Help texts of flags several commands share
SPEC_HELP = 'backbone config entry as JSON, e.g. \'{"kind": "efficientnet_lite0", "trainable_blocks": 1}\''

STUDY_KEY_HELP = ("the study's secret key file (created with mode 0600 if missing; the workflow keeps it at "
                  "<results>/private/study.key): it keys every random draw, so keep it private and back it up")



def add_replace_release(parser) -> None:
    """--replace-release, for every command that releases (finetune, statistics --source private, audit)."""
    parser.add_argument("--replace-release", nargs="?", const=True, default=False, type=yes_or_no,
                        help="release even where the study's release log holds another run's release at this "
                             "path (the earlier one keeps counting in the ledger); also '--replace-release no' or "
                             "'yes' (default: no, refuse)")
