"""The `ggufbridge` program (console script and `python -m ggufbridge`). Termination signals are handled before
anything else is imported, so that the first milliseconds of a command behave like the rest of it."""

from ggufbridge.signals import exit_on_signals

exit_on_signals()


def main() -> None:
    from ggufbridge.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
