"""Run control: stop signals and a lost launcher (``preemption``), the progress and ETA of a run (``progress``)."""
