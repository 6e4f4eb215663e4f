"""Shared pieces of the CLI: turning library errors into one-line messages with exit code 2."""

from __future__ import annotations

import functools

import click

from ggufbridge.errors import GGUFBridgeError


class UserError(click.ClickException):
    exit_code = 2


def user_errors(fn):
    """Run a command body; a GGUFBridgeError (or OSError) becomes `Error: <one line>` and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GGUFBridgeError as e:
            raise UserError(str(e)) from None
        except OSError as e:
            raise UserError(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None

    return wrapper
