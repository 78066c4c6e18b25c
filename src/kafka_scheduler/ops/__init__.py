"""The operations surfaces of a running job: Prometheus metrics (metrics.py, input_lag.py), the status page
(status_page.py, recent.py) served on the metrics port (http_server.py), and inspection of a checkpoint
(inspection.py)."""
