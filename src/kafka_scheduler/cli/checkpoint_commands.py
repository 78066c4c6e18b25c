"""The commands that read a checkpoint's pending schedules with Spark's state data source: inspect and list."""

from __future__ import annotations

import argparse
import logging
import os
from datetime import UTC

from ..config import OPTION_NAMES, shown_default
from .command_line import CommandError


def add_parsers(commands) -> None:
    """inspect and list, on the top parser's subcommands."""
    inspect = commands.add_parser(
        "inspect",
        help="pending schedules read from a checkpoint",
        description="Read the pending schedules straight from a checkpoint with Spark's state data source, whether "
        "the job runs or not (it reads the last committed batch): how many match, how many fall due "
        "per hour (next 48 hours) and per day (next 30 days), and the first ones in full (key, value, "
        "headers, due time, delivery id). Starts a local Spark session (a few seconds).",
    )
    inspect.add_argument("--checkpoint-dir", metavar="DIR", help="the job's checkpoint (default checkpoints/<app-id>)")
    inspect.add_argument(
        "--app-id",
        default=OPTION_NAMES["app_id"].default,
        metavar="ID",
        help=f"the app whose default checkpoint to read (default {shown_default(OPTION_NAMES['app_id'])})",
    )
    inspect.add_argument(
        "--id",
        action="append",
        default=[],
        metavar="ID",
        help="only the schedule with this request id (repeat for more); shown in full",
    )
    inspect.add_argument("--destination", metavar="TOPIC", help="only schedules delivered to this topic")
    inspect.add_argument("--input-topic", metavar="TOPIC", help="only schedules requested on this input topic")
    inspect.add_argument(
        "--from", dest="due_from", metavar="TIME", help="only schedules due at or after this ISO-8601 instant"
    )
    inspect.add_argument("--to", dest="due_until", metavar="TIME", help="only schedules due before this instant")
    inspect.add_argument(
        "--limit",
        type=int,
        default=20,
        metavar="N",
        help="show at most N schedules, those due first (default 20; 0: counts only)",
    )
    inspect.add_argument("--format", choices=("table", "json"), default="table", help="output (default table)")
    inspect.set_defaults(handler=cmd_inspect)

    listing = commands.add_parser(
        "list",
        help="pending schedules read from a checkpoint, a page at a time",
        description="List the pending schedules of a checkpoint by due time (then delivery id), one page at a time, "
        "read with Spark's state data source whether the job runs or not (the last committed batch; a "
        "local Spark session starts, a few seconds): one-shots and recurring schedules (their next "
        "firing, with the cron's definition). Each page ends with the token of the next one: give it "
        "to --page-token with the same filters. The state may move on between pages: no schedule is "
        "listed twice, one pending all along is listed once, one added or replaced meanwhile shows if it "
        "falls after the pages already read.",
        epilog="example: kafka-scheduler list --checkpoint-dir /data/reminders --destination orders "
        "--due-after 2026-12-24T00:00:00Z --limit 20",
    )
    listing.add_argument("--checkpoint-dir", metavar="DIR", help="the job's checkpoint (default checkpoints/<app-id>)")
    listing.add_argument(
        "--app-id",
        default=OPTION_NAMES["app_id"].default,
        metavar="ID",
        help=f"the app whose default checkpoint to read (default {shown_default(OPTION_NAMES['app_id'])})",
    )
    listing.add_argument("--due-after", metavar="TIME", help="only schedules due at or after this ISO-8601 instant")
    listing.add_argument("--due-before", metavar="TIME", help="only schedules due before this ISO-8601 instant")
    listing.add_argument("--destination", metavar="TOPIC", help="only schedules delivered to this topic")
    listing.add_argument("--id-prefix", metavar="TEXT", help="only schedules whose request id starts with TEXT")
    listing.add_argument("--kind", metavar="KIND", help="only one-shot or only cron (recurring) schedules")
    listing.add_argument("--limit", default="50", metavar="N", help="schedules per page, 1 to 1000 (default 50)")
    listing.add_argument(
        "--page-token",
        metavar="TOKEN",
        help="the next page: the token the previous page printed (with the same filters)",
    )
    listing.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table, or json for scripts (next_page_token in it) (default table)",
    )
    listing.set_defaults(handler=cmd_list)


def _instant_ms(text: str, flag: str) -> int:
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(f"{flag} {text!r}: expected an ISO-8601 instant, e.g. 2026-12-24T18:00:00Z") from None
    if moment.tzinfo is None:
        raise CommandError(f"{flag} {text!r}: give a time zone (Z or +01:00)")
    return int(moment.astimezone(UTC).timestamp() * 1000)


def cmd_inspect(args: argparse.Namespace) -> int:
    import time

    from ..config import Config
    from ..engine.spark.checkpoint import last_committed_batch
    from ..engine.spark.state_reader import tool_session
    from ..ops.inspection import Filters, inspect_checkpoint, render_json, render_table

    checkpoint_dir = args.checkpoint_dir or Config(app_id=args.app_id).checkpoint_dir
    if not os.path.isdir(checkpoint_dir) and "://" not in checkpoint_dir:
        raise CommandError(f"no checkpoint at {checkpoint_dir} (--checkpoint-dir)")
    filters = Filters(
        ids=tuple(args.id),
        destination=args.destination,
        input_topic=args.input_topic,
        due_from_ms=_instant_ms(args.due_from, "--from") if args.due_from else None,
        due_until_ms=_instant_ms(args.due_until, "--to") if args.due_until else None,
    )
    batch = last_committed_batch(checkpoint_dir)
    if batch is None:
        raise CommandError(f"checkpoint {checkpoint_dir} has no committed batch yet: nothing to inspect")
    logging.getLogger(__name__).info("inspect: starting Spark to read %s (batch %d)", checkpoint_dir, batch)
    spark = tool_session(args.app_id, checkpoint_dir)
    try:
        found = inspect_checkpoint(spark, checkpoint_dir, filters, int(time.time() * 1000), batch, args.limit)
    finally:
        spark.stop()
    print(render_json(found) if args.format == "json" else render_table(found, filters))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import json
    import time

    from ..config import Config
    from ..engine.spark.checkpoint import last_committed_batch
    from ..engine.spark.state_reader import CheckpointState, tool_session
    from ..ops.listing import BadPageToken, list_query, list_schedules, render_table

    values = {
        "due_after": args.due_after,
        "due_before": args.due_before,
        "destination": args.destination,
        "id_prefix": args.id_prefix,
        "kind": args.kind,
        "limit": args.limit,
        "page_token": args.page_token,
    }
    try:
        filters, limit, cursor = list_query(values)
    except BadPageToken as exc:
        raise CommandError(f"--page-token: {exc}") from None
    except ValueError as exc:
        raise CommandError("--" + str(exc).replace("_", "-", 1)) from None
    checkpoint_dir = args.checkpoint_dir or Config(app_id=args.app_id).checkpoint_dir
    if not os.path.isdir(checkpoint_dir) and "://" not in checkpoint_dir:
        raise CommandError(f"no checkpoint at {checkpoint_dir} (--checkpoint-dir)")
    batch = last_committed_batch(checkpoint_dir)
    if batch is None:
        raise CommandError(f"checkpoint {checkpoint_dir} has no committed batch yet: nothing to list")
    logging.getLogger(__name__).info("list: starting Spark to read %s (batch %d)", checkpoint_dir, batch)
    spark = tool_session(args.app_id, checkpoint_dir)
    try:
        as_of_ms = int(time.time() * 1000)
        started = time.monotonic()
        state = CheckpointState(spark, checkpoint_dir, batch)
        found = list_schedules(state, filters, limit, cursor, as_of_ms, batch)
        logging.getLogger(__name__).info(
            "list: page read in %.1fs (%d Spark jobs, %d time buckets; %s)",
            time.monotonic() - started,
            state.jobs,
            found.buckets_read,
            ", ".join(f"{k} {v:.1f}s" for k, v in found.phases_s.items()),
        )
    finally:
        spark.stop()
    print(json.dumps(found.to_json(), indent=2) if args.format == "json" else render_table(found))
    return 0
