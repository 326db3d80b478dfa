package transferservice.scenario;

import java.util.List;
import java.util.Map;
import java.util.function.Predicate;

import transferservice.client.ApiClient;
import transferservice.client.ApiException;
import transferservice.client.api.AccountsApi;
import transferservice.client.api.EventsApi;
import transferservice.client.api.TransfersApi;
import transferservice.client.model.BatchItem;
import transferservice.client.model.BatchProblem;
import transferservice.client.model.BatchResult;
import transferservice.client.model.BatchTransfer;
import transferservice.client.model.CaptureHold;
import transferservice.client.model.CreateAccount;
import transferservice.client.model.CreateBatch;
import transferservice.client.model.CreateLeg;
import transferservice.client.model.CreateTransfer;
import transferservice.client.model.Event;
import transferservice.client.model.EventPage;
import transferservice.client.model.MultiLegTransfer;
import transferservice.client.model.OneLegTransfer;
import transferservice.client.model.Problem;
import transferservice.client.model.RollbackReason;
import transferservice.client.model.Transfer;
import transferservice.client.model.TransferPage;
import transferservice.client.model.TransferState;

/**
 * The generated-clients scenario (the same in Python and TypeScript, tools/generated-clients/),
 * through the Java client openapi-generator made from openapi/openapi.json, unedited, with no
 * token: accounts, a one-leg transfer polled to its end, a multi-leg one, the listing by
 * account, state and metadata, holds captured in part and whole (no body), a cancel, a batch
 * with a rolled-back and a refused item, a problem read as the declared type, the feed
 * followed by its cursor. Ids carry a prefix of this run, so it runs again on the same service.
 * Any failed check throws (the build fails); the last line says it passed.
 */
public final class Scenario {
  private final TransfersApi transfers;
  private final String run = "java-" + System.currentTimeMillis() + "-";

  private Scenario(ApiClient client) {
    this.transfers = new TransfersApi(client);
  }

  public static void main(String[] args) throws Exception {
    ApiClient client = new ApiClient();
    client.setBasePath(args[0]);
    new Scenario(client).run(client);
    System.out.println("java scenario passed");
  }

  private void run(ApiClient client) throws Exception {
    AccountsApi accounts = new AccountsApi(client);
    for (String name : List.of("alice", "bob", "carol", "fees")) {
      long balance = name.equals("alice") ? 1000 : 0;
      accounts.createAccount(new CreateAccount().id(id(name)).balance(balance));
    }
    check(accounts.getAccount(id("alice")).getBalance() == 1000, "alice opened with 1000");

    // One leg, polled to its end.
    Transfer one = transfers.createTransfer(new CreateTransfer(new OneLegTransfer()
        .id(id("t-1")).from(id("alice")).to(id("bob")).amount(100L)
        .metadata(Map.of("order_id", id("o-1")))), null);
    check(one.getLegs().size() == 1, "a one-leg transfer has one leg");
    Transfer settled = until(id("t-1"), t -> isTerminal(t.getState()), "5s");
    check(settled.getState() == TransferState.FINISHED, "t-1 finished: " + settled);

    // Several legs.
    transfers.createTransfer(new CreateTransfer(new MultiLegTransfer().id(id("t-2")).legs(List.of(
        new CreateLeg().from(id("alice")).to(id("bob")).amount(95L),
        new CreateLeg().from(id("alice")).to(id("fees")).amount(5L)))), null);
    Transfer multi = until(id("t-2"), t -> isTerminal(t.getState()), "5s");
    check(multi.getState() == TransferState.FINISHED && multi.getLegs().size() == 2,
        "t-2 finished with two legs: " + multi);
    check(multi.getFrom() == null, "a multi-leg transfer has no `from`");

    // The listing: by account, by state, by metadata (a page at a time, by the cursor).
    TransferPage byAccount = transfers.listTransfers(id("fees"), null, null, null, null, null);
    check(ids(byAccount).equals(List.of(id("t-2"))), "fees' transfers: " + ids(byAccount));
    TransferPage finished =
        transfers.listTransfers(id("bob"), TransferState.FINISHED, null, null, 1, null);
    check(ids(finished).equals(List.of(id("t-2"))), "bob's newest finished: " + ids(finished));
    TransferPage next = transfers.listTransfers(
        id("bob"), TransferState.FINISHED, null, null, 1, finished.getNextCursor());
    check(ids(next).equals(List.of(id("t-1"))), "then by the cursor: " + ids(next));
    TransferPage byMetadata = transfers.listTransfers(
        null, null, null, List.of("order_id:" + id("o-1")), null, null);
    check(ids(byMetadata).equals(List.of(id("t-1"))), "by metadata: " + ids(byMetadata));

    // Holds: one captured in part, one whole with no body.
    hold("h-1", 50);
    Transfer part = transfers.captureTransfer(id("h-1"), new CaptureHold().amount(20L));
    check(part.getCapturedAmount() == 20, "h-1 captured 20: " + part);
    hold("h-2", 30);
    Transfer whole = transfers.captureTransfer(id("h-2"), null);
    check(whole.getCapturedAmount() == 30, "h-2 captured whole: " + whole);

    // A cancel.
    hold("h-3", 10);
    transfers.cancelTransfer(id("h-3"));
    Transfer cancelled = until(id("h-3"), t -> isTerminal(t.getState()), "5s");
    check(cancelled.getState() == TransferState.ROLLED_BACK
        && cancelled.getReason() == RollbackReason.CANCELLED, "h-3 cancelled: " + cancelled);

    // A batch: one made, one rolled back (no such account), one refused (from = to).
    BatchResult batch = transfers.createBatch(new CreateBatch().transfers(List.of(
        new CreateTransfer(new OneLegTransfer().id(id("b-1")).from(id("alice")).to(id("bob"))
            .amount(1L)),
        new CreateTransfer(new OneLegTransfer().id(id("b-2")).from(id("nobody")).to(id("bob"))
            .amount(1L)),
        new CreateTransfer(new OneLegTransfer().id(id("b-3")).from(id("bob")).to(id("bob"))
            .amount(1L)))), null);
    List<BatchItem> items = batch.getItems();
    check(items.get(0).getActualInstance() instanceof BatchTransfer, "b-1 is a transfer");
    check(items.get(1).getBatchTransfer().getStatus() == 201, "b-2 was created");
    Transfer rolledBack = until(id("b-2"), t -> isTerminal(t.getState()), "5s");
    check(rolledBack.getReason() == RollbackReason.ACCOUNT_NOT_FOUND,
        "b-2 rolled back: " + rolledBack);
    BatchProblem refused = items.get(2).getBatchProblem();
    check(refused.getStatus() == 422 && refused.getProblem().getStatus() == 422,
        "b-3 refused: " + refused);

    // A problem, read as the type the document declares for it.
    try {
      accounts.getAccount(id("nobody"));
      throw new AssertionError("no such account, yet an answer");
    } catch (ApiException e) {
      Problem problem = Problem.fromJson(e.getResponseBody());
      check(e.getCode() == 404 && problem.getStatus() == 404
          && problem.getType().equals("/problems/not-found"), "a 404 problem: " + problem);
    }

    // The feed, from the start, page after page by the cursor: t-1's events are there.
    EventsApi events = new EventsApi(client);
    String after = null;
    int seen = 0;
    for (int page = 0; page < 1000; page++) {
      EventPage got = events.listEvents(after, 2, null);
      for (Event event : got.getItems()) {
        if (event.getTransfer().getId().equals(id("t-1"))
            && event.getType() == Event.TypeEnum.TRANSFER_FINISHED
            && event.getAt() != null) {
          seen++;
        }
      }
      if (got.getItems().isEmpty()) {
        break;
      }
      after = got.getNextCursor();
    }
    check(seen >= 1, "t-1's finished event in the feed");
  }

  /** A hold of `amount` from alice to carol, waited for until it is pending. */
  private void hold(String name, long amount) throws Exception {
    transfers.createTransfer(new CreateTransfer(new OneLegTransfer().id(id(name))
        .from(id("alice")).to(id("carol")).amount(amount).hold(true)), null);
    until(id(name), t -> t.getState() == TransferState.PENDING, "0s");
  }

  /**
   * The transfer once `done` holds for it, polled (each poll long-polls up to `wait` for a
   * terminal state), at most 20 s.
   */
  private Transfer until(String transferId, Predicate<Transfer> done, String wait)
      throws Exception {
    long deadline = System.currentTimeMillis() + 20_000;
    while (true) {
      Transfer transfer = transfers.getTransfer(transferId, wait);
      if (done.test(transfer)) {
        return transfer;
      }
      check(System.currentTimeMillis() < deadline, "gave up waiting on " + transfer);
      Thread.sleep(50);
    }
  }

  private static boolean isTerminal(TransferState state) {
    return state == TransferState.FINISHED || state == TransferState.ROLLED_BACK;
  }

  private static List<String> ids(TransferPage page) {
    return page.getItems().stream().map(Transfer::getId).toList();
  }

  private String id(String name) {
    return run + name;
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new AssertionError(what);
    }
  }
}
