from kvplan.cli import run

run()
