"""Argument types shared by the management commands: bounded, and never echoing what was
given (an argument may be patient data). Django lists no command for a module whose name
starts with an underscore."""

from __future__ import annotations

import argparse
import math
import re
from argparse import ArgumentTypeError
from collections.abc import Callable, Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from nexus_workflows.limits import MAX_DELAY

#: Longest number of seconds an argument takes: ten years, as for the settings.
MAX_SECONDS = MAX_DELAY.total_seconds()


def whole_number(least: int, most: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argument type: an int from ``least`` to ``most``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:  # not a number, or too many digits to read
            number = least - 1
        if not least <= number <= most:
            raise ArgumentTypeError(f"must be {what} of at least {least} and at most {most:,}")
        return number

    return parse


def number(value: str) -> float:
    """An argument type: any float (the command checks its range), read without echoing it."""
    try:
        return float(value)
    except ValueError:
        raise ArgumentTypeError("must be a number") from None


def seconds(value: str) -> float:
    """An argument type: a number of seconds greater than 0 and at most MAX_SECONDS."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number <= MAX_SECONDS:
        raise ArgumentTypeError(
            f"must be a number of seconds greater than 0 and at most {MAX_SECONDS:,.0f} (ten years)"
        )
    return number


#: argparse's own messages that quote what was given, and what each says instead.
_ECHOES = (
    # A JSON trigger left unquoted splits into many arguments: the extra ones are listed.
    (
        re.compile(r"unrecognized arguments: .*", re.S),
        "unrecognized arguments (not shown: they may be patient data)",
    ),
    (re.compile(r"invalid choice: .*?(?= \(choose from |$)", re.S), "invalid choice"),
    (re.compile(r"(invalid \S+ value): .*", re.S), r"\1"),
    (re.compile(r"ambiguous option: .*? could match", re.S), "ambiguous option: it could match"),
)


def without_values(message: str) -> str:
    """An argparse error message with whatever it quoted of the arguments taken out."""
    for echo, instead in _ECHOES:
        message = echo.sub(instead, message)
    return message


class ParserNotEchoing(CommandParser):
    """Django's parser, whose errors (on standard error, or in the ``CommandError`` of
    ``call_command``) never quote an argument: it may be a trigger or a key."""

    def error(self, message: str) -> Any:
        return super().error(without_values(message))


class ArgumentsNotEchoed(BaseCommand):
    """A command whose parser, and each of its subcommands', is :class:`ParserNotEchoing`.
    Django builds a plain ``CommandParser`` (``create_parser`` takes no class), so each
    parser it built is narrowed to this subclass, which adds only ``error``."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        for each in _parsers_of(parser):
            each.__class__ = ParserNotEchoing
        return parser


def _parsers_of(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:  # argparse lists subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                yield from _parsers_of(subparser)
