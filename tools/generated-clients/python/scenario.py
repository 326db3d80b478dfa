"""The generated-clients scenario (the same in Java and TypeScript, tools/generated-clients/),
through the Python client openapi-python-client made from openapi/openapi.json, unedited, with
no token: accounts, a one-leg transfer polled to its end, a multi-leg one, the listing by
account, state and metadata, holds captured in part and whole (no body), a cancel, a batch
with a rolled-back and a refused item, a problem read as the declared type, the feed followed
by its cursor. Ids carry a prefix of this run, so it runs again on the same service.

    python scenario.py http://127.0.0.1:8080   (with the generated package on PYTHONPATH)

A failed check raises (exit status 1); the last line says it passed.

openapi-python-client 0.29.1 annotates `client: AuthenticatedClient` on every operation whose
security names a scheme, even when `{}` (no key) is one of its alternatives (its issue #1372):
a plain `Client`, without a token, is what a service without API keys takes, and it works.
"""

import sys
import time

from transfer_service_client import Client
from transfer_service_client.api.accounts import create_account, get_account
from transfer_service_client.api.events import list_events
from transfer_service_client.api.transfers import (
    cancel_transfer,
    capture_transfer,
    create_batch,
    create_transfer,
    get_transfer,
    list_transfers,
)
from transfer_service_client.models import (
    BatchProblem,
    BatchTransfer,
    CaptureHold,
    CreateAccount,
    CreateBatch,
    CreateLeg,
    EventType,
    Metadata,
    MultiLegTransfer,
    OneLegTransfer,
    Problem,
    RollbackReason,
    Transfer,
    TransferState,
)

RUN = f"python-{int(time.time() * 1000)}-"
TERMINAL = (TransferState.FINISHED, TransferState.ROLLED_BACK)


def name(short):
    return RUN + short


def check(ok, what):
    if not ok:
        raise AssertionError(what)


def until(client, transfer_id, done, wait):
    """The transfer once `done` holds for it, polled (each poll long-polls up to `wait` for a
    terminal state), at most 20 s."""
    deadline = time.monotonic() + 20
    while True:
        transfer = get_transfer.sync(transfer_id, client=client, wait=wait)
        check(isinstance(transfer, Transfer), f"a transfer: {transfer}")
        if done(transfer):
            return transfer
        check(time.monotonic() < deadline, f"gave up waiting on {transfer}")
        time.sleep(0.05)


def hold(client, short, amount):
    """A hold of `amount` from alice to carol, waited for until it is pending."""
    body = OneLegTransfer(
        id=name(short), from_=name("alice"), to=name("carol"), amount=amount, hold=True
    )
    check(isinstance(create_transfer.sync(client=client, body=body), Transfer), short)
    until(client, name(short), lambda t: t.state == TransferState.PENDING, "0s")


def ids(page):
    return [t.id for t in page.items]


def main(base_url):
    client = Client(base_url=base_url, raise_on_unexpected_status=True)
    for short in ("alice", "bob", "carol", "fees"):
        balance = 1000 if short == "alice" else 0
        account = create_account.sync(
            client=client, body=CreateAccount(id=name(short), balance=balance)
        )
        check(account.balance == balance, f"{short} opened: {account}")

    # One leg, polled to its end.
    one = create_transfer.sync(
        client=client,
        body=OneLegTransfer(
            id=name("t-1"),
            from_=name("alice"),
            to=name("bob"),
            amount=100,
            metadata=Metadata.from_dict({"order_id": name("o-1")}),
        ),
    )
    check(len(one.legs) == 1, f"one leg: {one}")
    settled = until(client, name("t-1"), lambda t: t.state in TERMINAL, "5s")
    check(settled.state == TransferState.FINISHED, f"t-1 finished: {settled}")

    # Several legs.
    legs = [
        CreateLeg(from_=name("alice"), to=name("bob"), amount=95),
        CreateLeg(from_=name("alice"), to=name("fees"), amount=5),
    ]
    create_transfer.sync(client=client, body=MultiLegTransfer(id=name("t-2"), legs=legs))
    multi = until(client, name("t-2"), lambda t: t.state in TERMINAL, "5s")
    check(
        multi.state == TransferState.FINISHED and len(multi.legs) == 2,
        f"t-2 finished with two legs: {multi}",
    )

    # The listing: by account, by state, by metadata (a page at a time, by the cursor).
    page = list_transfers.sync(client=client, account=name("fees"))
    check(ids(page) == [name("t-2")], f"fees' transfers: {ids(page)}")
    page = list_transfers.sync(
        client=client, account=name("bob"), state=TransferState.FINISHED, limit=1
    )
    check(ids(page) == [name("t-2")], f"bob's newest finished: {ids(page)}")
    page = list_transfers.sync(
        client=client,
        account=name("bob"),
        state=TransferState.FINISHED,
        limit=1,
        cursor=page.next_cursor,
    )
    check(ids(page) == [name("t-1")], f"then by the cursor: {ids(page)}")
    page = list_transfers.sync(client=client, metadata=[f"order_id:{name('o-1')}"])
    check(ids(page) == [name("t-1")], f"by metadata: {ids(page)}")

    # Holds: one captured in part, one whole with no body.
    hold(client, "h-1", 50)
    part = capture_transfer.sync(name("h-1"), client=client, body=CaptureHold(amount=20))
    check(part.captured_amount == 20, f"h-1 captured 20: {part}")
    hold(client, "h-2", 30)
    whole = capture_transfer.sync(name("h-2"), client=client)
    check(whole.captured_amount == 30, f"h-2 captured whole: {whole}")

    # A cancel.
    hold(client, "h-3", 10)
    cancel_transfer.sync(name("h-3"), client=client)
    cancelled = until(client, name("h-3"), lambda t: t.state in TERMINAL, "5s")
    check(
        cancelled.state == TransferState.ROLLED_BACK
        and cancelled.reason == RollbackReason.CANCELLED,
        f"h-3 cancelled: {cancelled}",
    )

    # A batch: one made, one rolled back (no such account), one refused (from = to).
    items = [
        OneLegTransfer(id=name("b-1"), from_=name("alice"), to=name("bob"), amount=1),
        OneLegTransfer(id=name("b-2"), from_=name("nobody"), to=name("bob"), amount=1),
        OneLegTransfer(id=name("b-3"), from_=name("bob"), to=name("bob"), amount=1),
    ]
    batch = create_batch.sync(client=client, body=CreateBatch(transfers=items))
    made, rolled, refused = batch.items
    check(isinstance(made, BatchTransfer) and made.status == 201, f"b-1 made: {made}")
    check(isinstance(rolled, BatchTransfer), f"b-2 created: {rolled}")
    rolled_back = until(client, name("b-2"), lambda t: t.state in TERMINAL, "5s")
    check(
        rolled_back.reason == RollbackReason.ACCOUNT_NOT_FOUND,
        f"b-2 rolled back: {rolled_back}",
    )
    check(
        isinstance(refused, BatchProblem) and refused.problem.status == 422,
        f"b-3 refused: {refused}",
    )

    # A problem, read as the type the document declares for it.
    problem = get_account.sync(name("nobody"), client=client)
    check(
        isinstance(problem, Problem)
        and problem.status == 404
        and problem.type_ == "/problems/not-found",
        f"a 404 problem: {problem}",
    )

    # The feed, from the start, page after page by the cursor: t-1's events are there.
    after = None
    seen = 0
    for _ in range(1000):
        kwargs = {"after": after} if after else {}
        page = list_events.sync(client=client, limit=2, **kwargs)
        for event in page.items:
            if (
                event.transfer.id == name("t-1")
                and event.type_ == EventType.TRANSFER_FINISHED
                and event.at.tzinfo is not None
            ):
                seen += 1
        if not page.items:
            break
        after = page.next_cursor
    check(seen >= 1, "t-1's finished event in the feed")
    print("python scenario passed")


if __name__ == "__main__":
    main(sys.argv[1])
