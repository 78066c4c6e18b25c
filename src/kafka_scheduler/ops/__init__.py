"""The operations surfaces of a running job: Prometheus metrics (metrics.py, input_lag.py), the status page
(status_page.py, recent.py, upcoming.py) served on the metrics port (http_server.py), and a checkpoint's pending
schedules counted (inspection.py) and listed (listing.py)."""
