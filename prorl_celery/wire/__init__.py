"""What crosses the gateway: job intake, the result format, and the ProRL Agent Server v1
dialect.
"""
