"""CLI subcommands: each module exposes `add_parser(subparsers)`; handlers call the library."""
