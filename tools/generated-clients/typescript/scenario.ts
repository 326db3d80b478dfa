// The generated-clients scenario (the same in Java and Python, tools/generated-clients/), through
// the types openapi-typescript made from openapi/openapi.json (generated/schema.d.ts, unedited)
// and the openapi-fetch client, with no token: accounts, a one-leg transfer polled to its end, a
// multi-leg one, the listing by account, state and metadata, holds captured in part and whole
// (no body), a cancel, a batch with a rolled-back and a refused item, a problem read as the
// declared type, the feed followed by its cursor. Ids carry a prefix of this run, so it runs
// again on the same service. `tsc` checks every call against the document's types first.
//
//     node dist/scenario.js http://127.0.0.1:8080
//
// A failed check throws (exit status 1); the last line says it passed.

import createClient from "openapi-fetch";
import type { components, paths } from "./generated/schema.js";

type Transfer = components["schemas"]["Transfer"];
type Problem = components["schemas"]["Problem"];

const base = process.argv[2];
if (!base) throw new Error("usage: node dist/scenario.js <service URL>");
const client = createClient<paths>({ baseUrl: base });
const run = `typescript-${Date.now()}-`;
const name = (short: string) => run + short;
const terminal = (t: Transfer) => t.state === "finished" || t.state === "rolled-back";

function check(ok: boolean, what: string): asserts ok {
  if (!ok) throw new Error(what);
}

/** What an operation answered on success, or a failed check naming its problem. */
function answered<T>(result: { data?: T; error?: unknown }, what: string): T {
  check(result.data !== undefined, `${what}: ${JSON.stringify(result.error)}`);
  return result.data;
}

/** The transfer once `done` holds for it, polled (each poll long-polls up to `wait` for a
 * terminal state), at most 20 s. */
async function until(id: string, done: (t: Transfer) => boolean, wait: string): Promise<Transfer> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const transfer = answered(
      await client.GET("/transfers/{id}", { params: { path: { id }, query: { wait } } }),
      `GET ${id}`,
    );
    if (done(transfer)) return transfer;
    check(Date.now() < deadline, `gave up waiting on ${JSON.stringify(transfer)}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A hold of `amount` from alice to carol, waited for until it is pending. */
async function hold(short: string, amount: number): Promise<void> {
  const body = { id: name(short), from: name("alice"), to: name("carol"), amount, hold: true };
  answered(await client.POST("/transfers", { body }), short);
  await until(name(short), (t) => t.state === "pending", "0s");
}

const ids = (page: { items: Transfer[] }) => page.items.map((t) => t.id);

async function main(): Promise<void> {
  for (const short of ["alice", "bob", "carol", "fees"]) {
    const balance = short === "alice" ? 1000 : 0;
    const account = answered(
      await client.POST("/accounts", { body: { id: name(short), balance } }),
      short,
    );
    check(account.balance === balance, `${short} opened: ${JSON.stringify(account)}`);
  }

  // One leg, polled to its end.
  const one = answered(
    await client.POST("/transfers", {
      body: {
        id: name("t-1"),
        from: name("alice"),
        to: name("bob"),
        amount: 100,
        metadata: { order_id: name("o-1") },
      },
    }),
    "t-1",
  );
  check(one.legs.length === 1, `one leg: ${JSON.stringify(one)}`);
  const settled = await until(name("t-1"), terminal, "5s");
  check(settled.state === "finished", `t-1 finished: ${JSON.stringify(settled)}`);

  // Several legs.
  const legs = [
    { from: name("alice"), to: name("bob"), amount: 95 },
    { from: name("alice"), to: name("fees"), amount: 5 },
  ];
  answered(await client.POST("/transfers", { body: { id: name("t-2"), legs } }), "t-2");
  const multi = await until(name("t-2"), terminal, "5s");
  check(multi.state === "finished" && multi.legs.length === 2, `t-2: ${JSON.stringify(multi)}`);

  // The listing: by account, by state, by metadata (a page at a time, by the cursor).
  const list = async (query: NonNullable<paths["/transfers"]["get"]["parameters"]["query"]>) =>
    answered(await client.GET("/transfers", { params: { query } }), JSON.stringify(query));
  let page = await list({ account: name("fees") });
  check(ids(page).join() === name("t-2"), `fees' transfers: ${ids(page)}`);
  page = await list({ account: name("bob"), state: "finished", limit: 1 });
  check(ids(page).join() === name("t-2"), `bob's newest finished: ${ids(page)}`);
  const cursor = page.next_cursor ?? undefined;
  page = await list({ account: name("bob"), state: "finished", limit: 1, cursor });
  check(ids(page).join() === name("t-1"), `then by the cursor: ${ids(page)}`);
  page = await list({ metadata: [`order_id:${name("o-1")}`] });
  check(ids(page).join() === name("t-1"), `by metadata: ${ids(page)}`);

  // Holds: one captured in part, one whole with no body.
  await hold("h-1", 50);
  const part = answered(
    await client.POST("/transfers/{id}/capture", {
      params: { path: { id: name("h-1") } },
      body: { amount: 20 },
    }),
    "h-1",
  );
  check(part.captured_amount === 20, `h-1 captured 20: ${JSON.stringify(part)}`);
  await hold("h-2", 30);
  const whole = answered(
    await client.POST("/transfers/{id}/capture", { params: { path: { id: name("h-2") } } }),
    "h-2",
  );
  check(whole.captured_amount === 30, `h-2 captured whole: ${JSON.stringify(whole)}`);

  // A cancel.
  await hold("h-3", 10);
  answered(
    await client.POST("/transfers/{id}/cancel", { params: { path: { id: name("h-3") } } }),
    "cancel h-3",
  );
  const cancelled = await until(name("h-3"), terminal, "5s");
  check(
    cancelled.state === "rolled-back" && cancelled.reason === "cancelled",
    `h-3 cancelled: ${JSON.stringify(cancelled)}`,
  );

  // A batch: one made, one rolled back (no such account), one refused (from = to).
  const batch = answered(
    await client.POST("/transfers/batch", {
      body: {
        transfers: [
          { id: name("b-1"), from: name("alice"), to: name("bob"), amount: 1 },
          { id: name("b-2"), from: name("nobody"), to: name("bob"), amount: 1 },
          { id: name("b-3"), from: name("bob"), to: name("bob"), amount: 1 },
        ],
      },
    }),
    "batch",
  );
  const [made, rolled, refused] = batch.items;
  check(made?.outcome === "transfer" && made.status === 201, `b-1: ${JSON.stringify(made)}`);
  check(rolled?.outcome === "transfer", `b-2 created: ${JSON.stringify(rolled)}`);
  const rolledBack = await until(name("b-2"), terminal, "5s");
  check(rolledBack.reason === "account_not_found", `b-2: ${JSON.stringify(rolledBack)}`);
  check(
    refused?.outcome === "problem" && refused.problem.status === 422,
    `b-3 refused: ${JSON.stringify(refused)}`,
  );

  // A problem, read as the type the document declares for it.
  const missing = await client.GET("/accounts/{id}", { params: { path: { id: name("nobody") } } });
  const problem: Problem | undefined = missing.error;
  check(
    missing.response.status === 404 &&
      problem?.status === 404 &&
      problem.type === "/problems/not-found",
    `a 404 problem: ${JSON.stringify(problem)}`,
  );

  // The feed, from the start, page after page by the cursor: t-1's events are there.
  let after: string | undefined;
  let seen = 0;
  for (let pages = 0; pages < 1000; pages++) {
    const events = answered(
      await client.GET("/events", { params: { query: { after, limit: 2 } } }),
      "events",
    );
    for (const event of events.items) {
      const at = new Date(event.at);
      if (
        event.transfer.id === name("t-1") &&
        event.type === "transfer.finished" &&
        !Number.isNaN(at.getTime())
      ) {
        seen++;
      }
    }
    if (events.items.length === 0) break;
    after = events.next_cursor ?? undefined;
  }
  check(seen >= 1, "t-1's finished event in the feed");
  console.log("typescript scenario passed");
}

await main();
