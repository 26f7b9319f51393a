#!/bin/bash
# The stand-in's /entrypoint: what the official image's does for the commands make images runs
# (bash or python run as given; anything else is an airflow subcommand).
set -euo pipefail
case "${1:-}" in
    bash | python | python3) exec "$@" ;;
    "") exec airflow --help ;;
    *) exec airflow "$@" ;;
esac
