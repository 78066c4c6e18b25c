"""Entry point for spark-submit, which runs a Python file rather than a module:

    spark-submit --master spark://HOST:7077 --jars "$(ls .cache/jars/spark-kafka/*.jar | paste -sd,)" \
        --py-files dist/kafka_scheduler.zip scripts/spark-submit-entry.py run --bootstrap-servers ... --app-id ...
"""

from kafka_scheduler.cli.main import main

raise SystemExit(main())
