from kvplan.entry import run

run()
