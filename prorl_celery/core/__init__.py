"""The shared vocabulary: errors, job status, outcomes, settings, event loops.

Imports nothing of the project; handlers and the trainer SDK import from here.
"""
