package transferservice.cluster;

import java.io.BufferedReader;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.net.HttpURLConnection;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.function.UnaryOperator;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * A real search cluster of N nodes in one JVM, on 127.0.0.1, for tests: Elasticsearch or
 * OpenSearch, by the {@link Engine} given. This class is the part the launchers share (the
 * ports, the cluster's settings, the commands, the health checks); each engine's launcher
 * supplies how one of its nodes is built, started and closed, and how its transport is made
 * to misbehave.
 *
 * <p>Standard output carries only the lines a harness reads: {@code ELASTICSEARCH_URL=...},
 * {@code ELASTICSEARCH_NODES=...} once the cluster is healthy (the same names for either
 * engine: the service reads {@code ELASTICSEARCH_URL} for both), then exactly one line per
 * command, starting with the word shown below or with {@code error}. Logs go to standard
 * error.
 *
 * <p>Commands on standard input (node indexes are 0 to N-1; node i is named {@code node-i}):
 * <ul>
 * <li>{@code stop <i>} closes node i (its data is kept): {@code stopped <i>}.
 * <li>{@code start <i>} starts it again on the same ports and data and waits until the cluster
 *     is yellow with every running node (not while a blocking fault is in force, when the node
 *     could not join): {@code started <i>}.
 * <li>{@code health}: {@code health <the _cluster/health JSON>}.
 * <li>{@code isolate <i> [disconnect|unresponsive]}: node i and every other node stop reaching
 *     each other, both directions: {@code isolated <i> <mode>}.
 * <li>{@code partition <a,b,...> <c,...> [disconnect|unresponsive]}: the same between every node
 *     of one side and every node of the other (a node on neither side is untouched):
 *     {@code partitioned <a,b,...> <c,...> <mode>}.
 * <li>{@code slow <i> <ms>}: every request node i sends to another node leaves ms late (0
 *     ends it; responses are not delayed): {@code slowed <i> <ms>}.
 * <li>{@code heal}: every fault and delay is cleared on every node, then the launcher waits (at
 *     most two minutes) until every running node names the same master and the cluster is green
 *     with every running node: {@code healed <n> nodes green after <s> s}, or {@code error ...}
 *     on time-out.
 * <li>{@code primary <index>}: {@code primary <index> <i>}, the node holding the primary of
 *     shard 0 of that index.
 * <li>{@code master}: {@code master <i>}, the elected master.
 * </ul>
 * {@code primary} and {@code master} answer from the newest cluster state a running node has
 * applied (the highest term, then version), so from the majority's side of a cut: a master cut
 * off still names itself until its fault detection gives up, and a new master applies its first
 * state only after the others did.
 *
 * <p>A fault is a rule on the sending node's transport ({@code disconnect}: a send fails at once and
 * no connection opens, as when a node is gone; {@code unresponsive}: what is sent is dropped
 * without an answer and no connection opens, so only the fault detection's time-outs notice).
 * Rules add up until {@code heal} (a later one for the same pair of nodes replaces the earlier);
 * rules naming a stopped node are kept, and it is given its own when it starts. End of input or
 * SIGTERM stops every node and deletes the data.
 */
public final class LocalCluster<N extends Closeable> {
    /** What differs between the engines (a node is closed with {@link Closeable#close}). */
    public interface Engine<N extends Closeable> {
        /** {@code Elasticsearch 8.19.21 (Lucene 9.12.2)}, for the start-up line. */
        String describe();

        /**
         * Builds a node with these settings (values: strings, or lists of them; see
         * {@link LocalCluster#apply}).
         */
        N build(Map<String, Object> settings) throws Exception;

        void start(N node) throws Exception;

        /** Whether the start failed because a port was taken. */
        boolean isBindFailure(Throwable e);

        /**
         * From now on, {@code from} (built, perhaps not started) applies {@code fault} to what
         * it sends to the node whose transport listens on 127.0.0.1:{@code port}, replacing any
         * rule it had for that node.
         */
        void addFault(N from, int port, Fault fault) throws Exception;

        /** From now on, every request {@code node} sends waits {@code millis} (0: none). */
        void setDelay(N node, long millis) throws Exception;

        /**
         * Removes every rule and delay from {@code node}; {@code ports} are every node's
         * transport port (the rules kept per node).
         */
        void clearFaults(N node, int[] ports) throws Exception;
    }

    /** What a node's transport does with what it sends to a node it is cut off from. */
    public enum Fault {
        /** The send fails at once, and no new connection opens: the other node looks gone. */
        DISCONNECT,
        /**
         * What is sent is dropped without an answer, and no new connection opens: the other
         * node looks hung, until the fault detection's time-outs give up on it.
         */
        UNRESPONSIVE;

        String word() {
            return name().toLowerCase(Locale.ROOT);
        }
    }

    /**
     * Gives each of {@code settings} to an engine's settings builder: {@code put} for a value,
     * {@code putList} for a list.
     */
    public static void apply(Map<String, Object> settings, BiConsumer<String, String> put,
            BiConsumer<String, List<String>> putList) {
        settings.forEach((key, value) -> {
            if (value instanceof List<?> list) {
                putList.accept(key, list.stream().map(String::valueOf).toList());
            } else {
                put.accept(key, String.valueOf(value));
            }
        });
    }

    private final Engine<N> engine;
    private final int nodeCount;
    private final Path home;
    private final List<String> extraSettings;
    private final int[] httpPorts;
    private final int[] transportPorts;
    private final List<N> nodes;
    private final boolean[] started;
    /** faults[from][to]: the rule node {@code from} applies to what it sends to {@code to}. */
    private final Fault[][] faults;
    /** delays[i]: how long every request node i sends waits, in ms (0: none). */
    private final long[] delays;

    private LocalCluster(Engine<N> engine, int nodeCount, Path home, List<String> extraSettings) {
        this.engine = engine;
        this.nodeCount = nodeCount;
        this.home = home;
        this.extraSettings = extraSettings;
        this.httpPorts = new int[nodeCount];
        this.transportPorts = new int[nodeCount];
        this.nodes = new ArrayList<>();
        for (int i = 0; i < nodeCount; i++) {
            nodes.add(null);
        }
        this.started = new boolean[nodeCount];
        this.faults = new Fault[nodeCount][nodeCount];
        this.delays = new long[nodeCount];
    }

    /** The launcher's main: {@code [--nodes N] [--setting key=value ...]}. */
    public static <N extends Closeable> void run(String[] args, Engine<N> engine) throws Exception {
        int nodeCount = 1;
        List<String> extraSettings = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--nodes" -> nodeCount = Integer.parseInt(args[++i]);
                case "--setting" -> extraSettings.add(args[++i]);
                default -> {
                    System.err.println("es-cluster: unknown argument " + args[i]);
                    System.exit(2);
                }
            }
        }
        if (nodeCount < 1 || nodeCount > 9) {
            System.err.println("es-cluster: --nodes must be 1 to 9");
            System.exit(2);
        }
        Path home = Files.createTempDirectory("es-cluster-");
        LocalCluster<N> cluster = new LocalCluster<>(engine, nodeCount, home, extraSettings);
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown, "es-cluster-shutdown"));
        long startedAt = System.nanoTime();
        cluster.startAll();
        cluster.announce();
        System.err.printf("es-cluster: %s, %d node(s), healthy after %.1f s at %s%n",
                engine.describe(), nodeCount, (System.nanoTime() - startedAt) / 1e9, cluster.url(0));
        cluster.serveCommands();
        // End of input: the shutdown hook stops the nodes and deletes the data.
        System.exit(0);
    }

    /**
     * Starts every node on ports free a moment before, picked below the kernel's ephemeral
     * range so that no outgoing connection (the tests open many) takes one in between; should
     * a port be taken all the same, the nodes started are stopped and the start is tried again
     * on other ports.
     */
    private void startAll() throws Exception {
        for (int attempt = 1; ; attempt++) {
            for (int i = 0; i < nodeCount; i++) {
                httpPorts[i] = freePort();
                transportPorts[i] = freePort();
            }
            try {
                for (int i = 0; i < nodeCount; i++) {
                    startNode(i);
                }
                break;
            } catch (Exception e) {
                if (attempt == 5 || !engine.isBindFailure(e)) {
                    throw e;
                }
                System.err.println("es-cluster: a port was taken while the nodes started; again on other ports");
                for (int i = 0; i < nodeCount; i++) {
                    if (nodes.get(i) != null) {
                        stopNode(i);
                    }
                    started[i] = false;
                    // A new cluster, from nothing: what a node wrote belonged to the last try.
                    Path data = home.resolve("data-" + i);
                    if (Files.exists(data)) {
                        deleteTree(data);
                    }
                }
            }
        }
        waitForHealth(nodeCount, "green");
    }

    /**
     * Whether {@code e} or one of its causes is a {@link java.net.BindException} or one of an
     * engine's {@code bindFailures} (its transport's and HTTP server's own exceptions for a port
     * taken).
     */
    public static boolean causedByBindFailure(Throwable e, Class<?>... bindFailures) {
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof java.net.BindException) {
                return true;
            }
            for (Class<?> failure : bindFailures) {
                if (failure.isInstance(cause)) {
                    return true;
                }
            }
        }
        return false;
    }

    /** A node's transport address as the others know it (its publish address: 127.0.0.1). */
    public static InetSocketAddress transportAddress(int port) throws IOException {
        return new InetSocketAddress(InetAddress.getByAddress(new byte[] {127, 0, 0, 1}), port);
    }

    /**
     * Sends what a slowed node sends, when its delay is up: one thread, so that the messages to a
     * node leave in the order they were sent (they all wait the same time).
     */
    private static final ScheduledExecutorService DELAYED_SENDS = Executors.newSingleThreadScheduledExecutor(task -> {
        Thread thread = new Thread(task, "es-cluster-delayed-sends");
        thread.setDaemon(true);
        return thread;
    });

    /** A request's send, which may fail. */
    public interface Send {
        void run() throws Exception;
    }

    /**
     * Runs {@code send} {@code millis} from now on {@link #DELAYED_SENDS}, in the context
     * {@code inContext} gives it (the sender's thread context); should the send fail, {@code failed}
     * is told, as a transport service tells a request's response handler when a send fails at once
     * (unless the node is closing: a {@link RuntimeException} from {@code failed} is dropped, the
     * node's handlers are failed as it closes).
     */
    public static void sendLater(long millis, UnaryOperator<Runnable> inContext, Send send, Consumer<Exception> failed) {
        Runnable later = inContext.apply(() -> {
            try {
                send.run();
            } catch (Exception e) {
                try {
                    failed.accept(e);
                } catch (RuntimeException closing) {
                    // The node is closing: its handlers are failed as it closes.
                }
            }
        });
        DELAYED_SENDS.schedule(later, millis, TimeUnit.MILLISECONDS);
    }

    private void announce() {
        System.out.println("ELASTICSEARCH_URL=" + url(0));
        String all = Stream.iterate(0, i -> i + 1).limit(nodeCount).map(this::url)
                .collect(Collectors.joining(","));
        System.out.println("ELASTICSEARCH_NODES=" + all);
        System.out.flush();
    }

    private void serveCommands() throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            try {
                switch (words[0]) {
                    case "stop" -> {
                        int i = nodeIndex(words);
                        stopNode(i);
                        reply("stopped " + i);
                    }
                    case "start" -> {
                        int i = nodeIndex(words);
                        startNode(i);
                        if (!anyFault()) {
                            waitForHealth(runningNodes(), "yellow");
                        }
                        reply("started " + i);
                    }
                    case "health" -> reply("health " + get(anyRunningUrl(), "/_cluster/health"));
                    case "isolate" -> {
                        expectWords(words, 2, 3, "isolate <i> [disconnect|unresponsive]");
                        int i = parseNode(words[1]);
                        Fault fault = parseFault(words, 2);
                        List<Integer> others = new ArrayList<>();
                        for (int j = 0; j < nodeCount; j++) {
                            if (j != i) {
                                others.add(j);
                            }
                        }
                        cut(List.of(i), others, fault);
                        reply("isolated " + i + " " + fault.word());
                    }
                    case "partition" -> {
                        expectWords(words, 3, 4, "partition <a,b,...> <c,...> [disconnect|unresponsive]");
                        List<Integer> left = parseNodes(words[1]);
                        List<Integer> right = parseNodes(words[2]);
                        for (int i : left) {
                            if (right.contains(i)) {
                                throw new IllegalArgumentException("node " + i + " is on both sides");
                            }
                        }
                        Fault fault = parseFault(words, 3);
                        cut(left, right, fault);
                        reply("partitioned " + join(left) + " " + join(right) + " " + fault.word());
                    }
                    case "slow" -> {
                        expectWords(words, 3, 3, "slow <i> <ms>");
                        int i = parseNode(words[1]);
                        long millis = Long.parseLong(words[2]);
                        if (millis < 0 || millis > 600_000) {
                            throw new IllegalArgumentException("ms must be 0 to 600000, not " + millis);
                        }
                        slow(i, millis);
                        reply("slowed " + i + " " + millis);
                    }
                    case "heal" -> {
                        expectWords(words, 1, 1, "heal");
                        long begun = System.nanoTime();
                        long deadline = begun + 120_000_000_000L;
                        heal();
                        int running = runningNodes();
                        // One master for every running node first: a master cut off may still
                        // think itself master while the others' master already counts it in.
                        awaitOneMaster(deadline);
                        awaitGreenRetryingAllocations(running, deadline);
                        reply(String.format(Locale.ROOT, "healed %d nodes green after %.1f s", running,
                                (System.nanoTime() - begun) / 1e9));
                    }
                    case "primary" -> {
                        expectWords(words, 2, 2, "primary <index>");
                        reply("primary " + words[1] + " " + primaryOf(words[1]));
                    }
                    case "master" -> {
                        expectWords(words, 1, 1, "master");
                        reply("master " + indexOfName(newestView(views(null)).master));
                    }
                    case "" -> {
                    }
                    default -> reply("error unknown command: " + line);
                }
            } catch (Exception e) {
                reply("error " + e.getClass().getSimpleName() + ": " + e.getMessage());
            }
        }
    }

    private int nodeIndex(String[] words) {
        if (words.length != 2) {
            throw new IllegalArgumentException("expected one node index, 0 to " + (nodeCount - 1));
        }
        return parseNode(words[1]);
    }

    private int parseNode(String word) {
        int i = Integer.parseInt(word);
        if (i < 0 || i >= nodeCount) {
            throw new IllegalArgumentException("no node " + i + "; nodes are 0 to " + (nodeCount - 1));
        }
        return i;
    }

    /** {@code 0,2}: distinct node indexes, in order. */
    private List<Integer> parseNodes(String word) {
        TreeSet<Integer> set = new TreeSet<>();
        for (String part : word.split(",")) {
            if (!part.isEmpty()) {
                set.add(parseNode(part));
            }
        }
        if (set.isEmpty()) {
            throw new IllegalArgumentException("a side names no node: " + word);
        }
        return new ArrayList<>(set);
    }

    private static Fault parseFault(String[] words, int at) {
        if (words.length <= at) {
            return Fault.DISCONNECT;
        }
        for (Fault fault : Fault.values()) {
            if (fault.word().equals(words[at])) {
                return fault;
            }
        }
        throw new IllegalArgumentException("expected disconnect or unresponsive, not " + words[at]);
    }

    private static void expectWords(String[] words, int min, int max, String usage) {
        if (words.length < min || words.length > max) {
            throw new IllegalArgumentException("usage: " + usage);
        }
    }

    private static String join(List<Integer> nodes) {
        return nodes.stream().map(String::valueOf).collect(Collectors.joining(","));
    }

    private static void reply(String line) {
        // One line per command, whatever an exception's message holds.
        System.out.println(line.replaceAll("[\\r\\n]+", " "));
        System.out.flush();
    }

    // ---- Network faults ----------------------------------------------------------------------

    /**
     * Every node of {@code left} and every node of {@code right} stop reaching each other, both
     * directions. A stopped node's rules are recorded and given to it when it starts.
     */
    private synchronized void cut(List<Integer> left, List<Integer> right, Fault fault) throws Exception {
        for (int a : left) {
            for (int b : right) {
                addFault(a, b, fault);
                addFault(b, a, fault);
            }
        }
    }

    private synchronized void addFault(int from, int to, Fault fault) throws Exception {
        faults[from][to] = fault;
        N node = nodes.get(from);
        if (node != null) {
            engine.addFault(node, transportPorts[to], fault);
        }
    }

    private synchronized void slow(int i, long millis) throws Exception {
        delays[i] = millis;
        N node = nodes.get(i);
        if (node != null) {
            engine.setDelay(node, millis);
        }
    }

    /** Clears every rule and delay on every node (the running ones now, the others when they start). */
    private synchronized void heal() throws Exception {
        for (int i = 0; i < nodeCount; i++) {
            Arrays.fill(faults[i], null);
            delays[i] = 0;
        }
        Exception first = null;
        for (int i = 0; i < nodeCount; i++) {
            N node = nodes.get(i);
            if (node != null) {
                try {
                    engine.clearFaults(node, transportPorts.clone());
                } catch (Exception e) {
                    if (first == null) {
                        first = e;
                    }
                }
            }
        }
        if (first != null) {
            throw first;
        }
    }

    /** Waits until every running node's own view names the same master. */
    private void awaitOneMaster(long deadline) throws Exception {
        String last = "no answer";
        while (System.nanoTime() < deadline) {
            try {
                List<View> views = views(null);
                List<String> masters = views.stream().map(v -> v.node + ":" + v.master).toList();
                if (views.size() == runningNodes() && views.get(0).master != null
                        && views.stream().allMatch(v -> views.get(0).master.equals(v.master))) {
                    return;
                }
                last = "node:master " + String.join(" ", masters);
            } catch (IOException e) {
                last = e.toString();
            }
            Thread.sleep(200);
        }
        throw new IllegalStateException("the running nodes name no one master: " + last);
    }

    private synchronized boolean anyFault() {
        for (Fault[] row : faults) {
            for (Fault fault : row) {
                if (fault != null) {
                    return true;
                }
            }
        }
        return false;
    }

    /** Gives a node just built (not started) the rules recorded for it. */
    private synchronized void applyFaults(int i, N node) throws Exception {
        for (int to = 0; to < nodeCount; to++) {
            if (faults[i][to] != null) {
                engine.addFault(node, transportPorts[to], faults[i][to]);
            }
        }
        if (delays[i] > 0) {
            engine.setDelay(node, delays[i]);
        }
    }

    // ---- Who is master, who holds a primary ----------------------------------------------------

    /**
     * One running node's own view: the cluster state it applied last (its {@code local=true}
     * answer), with the term and version of that state.
     */
    private record View(int node, String master, long term, long version, Map<?, ?> state) {
    }

    /**
     * The {@code _cluster/state} request for a view: the state's version and term, the master,
     * the nodes' names and, with an index, its routing table; {@code local=true}, so each node
     * answers from its own state, with no network hop.
     */
    private static String viewPath(String index) {
        String metrics = "version,master_node,nodes,metadata";
        String filter = "version,master_node,nodes.*.name,metadata.cluster_coordination.term";
        if (index != null) {
            metrics += ",routing_table/" + URLEncoder.encode(index, StandardCharsets.UTF_8);
            filter += ",routing_table";
        }
        return "/_cluster/state/" + metrics + "?local=true&filter_path=" + filter;
    }

    /**
     * Every running node's view. A node that does not answer 200 is left out; if none does, the
     * last failure is thrown.
     */
    private List<View> views(String index) throws IOException {
        String path = viewPath(index);
        List<View> views = new ArrayList<>();
        String lastFailure = "no node is running";
        for (int i = 0; i < nodeCount; i++) {
            String base;
            synchronized (this) {
                if (nodes.get(i) == null) {
                    continue;
                }
                base = url(i);
            }
            try {
                Response response = request(base, path, 10_000);
                if (response.status != 200) {
                    lastFailure = "node " + i + " answered " + response.status + ": " + response.body;
                    continue;
                }
                Map<?, ?> state = (Map<?, ?>) Json.parse(response.body);
                Object masterId = state.get("master_node");
                long term = state.get("metadata") instanceof Map<?, ?> metadata
                        && metadata.get("cluster_coordination") instanceof Map<?, ?> coordination
                        && coordination.get("term") instanceof Number number ? number.longValue() : -1;
                long version = state.get("version") instanceof Number number ? number.longValue() : -1;
                views.add(new View(i, masterId == null ? null : nodeNameOf(state, masterId.toString()), term, version,
                        state));
            } catch (IOException | RuntimeException e) {
                lastFailure = "node " + i + ": " + e;
            }
        }
        if (views.isEmpty()) {
            throw new IOException(lastFailure);
        }
        return views;
    }

    /**
     * The newest view that names a master: the highest term, then the highest version (the
     * master's own view on a tie). A term is won by an election of a majority, and a node
     * applies a state only once a majority accepted it, so this is the majority's master even
     * while one cut off still names itself, and while the new master's own view still lags (it
     * applies its first state only when every node acknowledged it or the publication timed out,
     * 30 s with a node unresponsive).
     */
    private View newestView(List<View> views) {
        View best = null;
        for (View view : views) {
            if (view.master == null) {
                continue;
            }
            if (best == null || view.term > best.term || (view.term == best.term && (view.version > best.version
                    || (view.version == best.version && view.node == indexOfName(view.master))))) {
                best = view;
            }
        }
        if (best == null) {
            throw new IllegalStateException("no running node knows a master (asked: "
                    + views.stream().map(v -> String.valueOf(v.node)).collect(Collectors.joining(",")) + ")");
        }
        return best;
    }

    /** The name of the node with id {@code id} in a cluster state's {@code nodes}, or null. */
    private static String nodeNameOf(Map<?, ?> state, String id) {
        if (state.get("nodes") instanceof Map<?, ?> all && all.get(id) instanceof Map<?, ?> node
                && node.get("name") instanceof String name) {
            return name;
        }
        return null;
    }

    /** {@code node-3} → 3. */
    private int indexOfName(String name) {
        if (name != null && name.startsWith("node-")) {
            try {
                int i = Integer.parseInt(name.substring("node-".length()));
                if (i >= 0 && i < nodeCount) {
                    return i;
                }
            } catch (NumberFormatException e) {
                // Not one of ours.
            }
        }
        throw new IllegalStateException("no node of this cluster is named " + name);
    }

    /** The node holding the primary of shard 0 of {@code index}, in the newest view. */
    private int primaryOf(String index) throws IOException {
        View source = newestView(views(index));
        Map<?, ?> indices = source.state.get("routing_table") instanceof Map<?, ?> table
                && table.get("indices") instanceof Map<?, ?> all ? all : Map.of();
        Object entry = indices.get(index);
        if (entry == null && indices.size() == 1) {
            entry = indices.values().iterator().next(); // an alias of one index
        }
        if (entry == null) {
            throw new IllegalStateException("no index " + index + " in node " + source.node + "'s cluster state");
        }
        if (!(entry instanceof Map<?, ?> routing) || !(routing.get("shards") instanceof Map<?, ?> shards)
                || !(shards.get("0") instanceof List<?> copies)) {
            throw new IllegalStateException("node " + source.node + " knows no shard 0 of " + index);
        }
        for (Object copy : copies) {
            if (copy instanceof Map<?, ?> shard && Boolean.TRUE.equals(shard.get("primary"))) {
                if (shard.get("node") == null) {
                    throw new IllegalStateException("the primary of shard 0 of " + index + " is unassigned ("
                            + shard.get("state") + ")");
                }
                return indexOfName(nodeNameOf(source.state, shard.get("node").toString()));
            }
        }
        throw new IllegalStateException("shard 0 of " + index + " has no primary in node " + source.node + "'s state");
    }

    /** Node {@code i}'s settings; both engines read these names. */
    private Map<String, Object> nodeSettings(int i) {
        Map<String, Object> settings = new LinkedHashMap<>();
        settings.put("cluster.name", "es-cluster-" + ProcessHandle.current().pid());
        settings.put("node.name", nodeName(i));
        settings.put("path.home", home.toString());
        settings.put("path.data", home.resolve("data-" + i).toString());
        settings.put("network.host", "127.0.0.1");
        settings.put("http.port", String.valueOf(httpPorts[i]));
        settings.put("transport.port", String.valueOf(transportPorts[i]));
        // One JVM on a 2-core machine: size every node's thread pools for one core.
        settings.put("node.processors", "1");
        // A test machine's disk may be fuller than production watermarks allow.
        settings.put("cluster.routing.allocation.disk.threshold_enabled", "false");
        settings.put("action.auto_create_index", "true");
        // Start returns at once; the cluster forms as the other nodes come up, and
        // waitForHealth is where the launcher waits.
        settings.put("discovery.initial_state_timeout", "0s");
        if (nodeCount == 1) {
            settings.put("discovery.type", "single-node");
        } else {
            List<String> names = new ArrayList<>();
            List<String> seeds = new ArrayList<>();
            for (int j = 0; j < nodeCount; j++) {
                names.add(nodeName(j));
                seeds.add("127.0.0.1:" + transportPorts[j]);
            }
            if (!started[i]) {
                // Bootstrapping is for a new cluster only; a restarted node rejoins from its data.
                settings.put("cluster.initial_master_nodes", names);
            }
            settings.put("discovery.seed_hosts", seeds);
        }
        for (String setting : extraSettings) {
            int eq = setting.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("--setting takes key=value, not " + setting);
            }
            settings.put(setting.substring(0, eq), setting.substring(eq + 1));
        }
        return settings;
    }

    private static String nodeName(int i) {
        return "node-" + i;
    }

    private synchronized void startNode(int i) throws Exception {
        if (nodes.get(i) != null) {
            throw new IllegalStateException("node " + i + " is running");
        }
        N node = engine.build(nodeSettings(i));
        try {
            // Its rules are in place before it sends anything.
            applyFaults(i, node);
            engine.start(node);
        } catch (Exception e) {
            // Release its data directory's lock, so that a later start may use it.
            node.close();
            throw e;
        }
        nodes.set(i, node);
        started[i] = true;
    }

    private synchronized void stopNode(int i) throws IOException {
        N node = nodes.get(i);
        if (node == null) {
            throw new IllegalStateException("node " + i + " is not running");
        }
        nodes.set(i, null);
        node.close();
    }

    private synchronized int runningNodes() {
        return (int) nodes.stream().filter(node -> node != null).count();
    }

    private synchronized String anyRunningUrl() {
        for (int i = 0; i < nodeCount; i++) {
            if (nodes.get(i) != null) {
                return url(i);
            }
        }
        throw new IllegalStateException("no node is running");
    }

    private String url(int i) {
        return "http://127.0.0.1:" + httpPorts[i];
    }

    /** Waits (at most two minutes) until `nodes` nodes have joined and health is `status` or better. */
    private void waitForHealth(int expectedNodes, String status) throws Exception {
        waitForHealth(expectedNodes, status, System.nanoTime() + 120_000_000_000L);
    }

    private void waitForHealth(int expectedNodes, String status, long deadline) throws Exception {
        String path = "/_cluster/health?wait_for_nodes=" + expectedNodes + "&wait_for_status=" + status
                + "&wait_for_no_initializing_shards=true&timeout=5s";
        String last = "no answer";
        while (System.nanoTime() < deadline) {
            try {
                last = get(anyRunningUrl(), path);
                if (last.contains("\"timed_out\":false")) {
                    return;
                }
            } catch (IOException e) {
                last = e.toString();
            }
            Thread.sleep(200);
        }
        throw new IllegalStateException("cluster not " + status + " with " + expectedNodes + " nodes: " + last);
    }

    /**
     * Waits for green as {@link #waitForHealth}, asking the master every 10 s to retry the
     * allocations that failed: a copy whose allocation failed five times (the engines'
     * {@code index.allocation.max_retries}) is never tried again by itself, and the cluster
     * would stay yellow. On OpenSearch a copy coming back to a node fails so while that node's
     * old copy is still held open by a search context (see the OpenSearch engine's settings);
     * on time-out, {@link #explainNotGreen} says what the engine reports.
     */
    private void awaitGreenRetryingAllocations(int nodes, long deadline) throws Exception {
        while (true) {
            try {
                post(anyRunningUrl(), "/_cluster/reroute?retry_failed=true");
            } catch (IOException e) {
                // The wait below says what is wrong if it lasts.
            }
            long round = Math.min(deadline, System.nanoTime() + 10_000_000_000L);
            try {
                waitForHealth(nodes, "green", round);
                return;
            } catch (IllegalStateException notYet) {
                if (round >= deadline) {
                    explainNotGreen();
                    throw notYet;
                }
            }
        }
    }

    /**
     * Writes to standard error what the engine says of a cluster that is not green: its shards,
     * its pending tasks and the allocation explanation of the first unassigned copy.
     */
    private void explainNotGreen() {
        String base;
        try {
            base = anyRunningUrl();
        } catch (IllegalStateException none) {
            return;
        }
        for (String path : List.of("/_cat/shards?v&h=index,shard,prirep,state,node,unassigned.reason",
                "/_cluster/pending_tasks", "/_cluster/allocation/explain?include_yes_decisions=false")) {
            try {
                System.err.println("es-cluster: not green: GET " + path + "\n" + get(base, path));
            } catch (IOException e) {
                System.err.println("es-cluster: not green: GET " + path + ": " + e);
            }
        }
    }

    private static void post(String base, String path) throws IOException {
        HttpURLConnection connection = (HttpURLConnection) URI.create(base + path).toURL().openConnection();
        connection.setConnectTimeout(2_000);
        connection.setReadTimeout(30_000);
        connection.setRequestMethod("POST");
        connection.getResponseCode();
        connection.disconnect();
    }

    private static String get(String base, String path) throws IOException {
        return request(base, path, 30_000).body;
    }

    private record Response(int status, String body) {
    }

    private static Response request(String base, String path, int readTimeoutMillis) throws IOException {
        HttpURLConnection connection = (HttpURLConnection) URI.create(base + path).toURL().openConnection();
        connection.setConnectTimeout(2_000);
        connection.setReadTimeout(readTimeoutMillis);
        try {
            int status = connection.getResponseCode();
            try (var body = status < 400 ? connection.getInputStream() : connection.getErrorStream()) {
                return new Response(status, body == null ? "" : new String(body.readAllBytes(), StandardCharsets.UTF_8));
            }
        } finally {
            connection.disconnect();
        }
    }

    /** A port free now, below the ephemeral range (where outgoing connections take theirs). */
    private static int freePort() throws IOException {
        int below = ephemeralLow();
        java.util.concurrent.ThreadLocalRandom random = java.util.concurrent.ThreadLocalRandom.current();
        for (int tries = 0; tries < 1000; tries++) {
            int port = random.nextInt(10_000, below);
            try (ServerSocket socket = new ServerSocket()) {
                socket.setReuseAddress(true);
                socket.bind(new InetSocketAddress("127.0.0.1", port));
                return port;
            } catch (IOException taken) {
                // Try another.
            }
        }
        throw new IOException("no free port between 10000 and " + below);
    }

    /** The first port of the kernel's ephemeral range (32768 if it cannot be read). */
    private static int ephemeralLow() {
        try {
            String range = Files.readString(Path.of("/proc/sys/net/ipv4/ip_local_port_range")).trim();
            int low = Integer.parseInt(range.split("\\s+")[0]);
            return low > 11_000 ? low : 32_768;
        } catch (IOException | RuntimeException e) {
            return 32_768;
        }
    }

    private synchronized void shutdown() {
        for (int i = 0; i < nodeCount; i++) {
            N node = nodes.get(i);
            if (node != null) {
                try {
                    node.close();
                } catch (Exception e) {
                    System.err.println("es-cluster: closing node " + i + ": " + e);
                }
                nodes.set(i, null);
            }
        }
        deleteTree(home);
    }

    private static void deleteTree(Path root) {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(path -> {
                try {
                    Files.deleteIfExists(path);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            });
        } catch (IOException | UncheckedIOException e) {
            System.err.println("es-cluster: deleting " + root + ": " + e);
        }
    }

    /** Just enough JSON for the cluster state: objects, arrays, strings, numbers, literals. */
    static final class Json {
        private final String text;
        private int at;

        private Json(String text) {
            this.text = text;
        }

        static Object parse(String text) {
            Json json = new Json(text);
            Object value = json.value();
            json.space();
            if (json.at != text.length()) {
                throw json.error("trailing text");
            }
            return value;
        }

        private Object value() {
            space();
            if (at >= text.length()) {
                throw error("unexpected end");
            }
            char c = text.charAt(at);
            switch (c) {
                case '{' -> {
                    at++;
                    Map<String, Object> object = new LinkedHashMap<>();
                    space();
                    if (peek('}')) {
                        return object;
                    }
                    do {
                        space();
                        String key = string();
                        space();
                        expect(':');
                        object.put(key, value());
                        space();
                    } while (peek(','));
                    expect('}');
                    return object;
                }
                case '[' -> {
                    at++;
                    List<Object> array = new ArrayList<>();
                    space();
                    if (peek(']')) {
                        return array;
                    }
                    do {
                        array.add(value());
                        space();
                    } while (peek(','));
                    expect(']');
                    return array;
                }
                case '"' -> {
                    return string();
                }
                default -> {
                    for (String literal : new String[] {"true", "false", "null"}) {
                        if (text.startsWith(literal, at)) {
                            at += literal.length();
                            return literal.equals("null") ? null : Boolean.valueOf(literal);
                        }
                    }
                    int begin = at;
                    while (at < text.length() && "+-0123456789.eE".indexOf(text.charAt(at)) >= 0) {
                        at++;
                    }
                    if (begin == at) {
                        throw error("unexpected " + c);
                    }
                    return Double.valueOf(text.substring(begin, at));
                }
            }
        }

        private String string() {
            expect('"');
            StringBuilder out = new StringBuilder();
            while (true) {
                if (at >= text.length()) {
                    throw error("unterminated string");
                }
                char c = text.charAt(at++);
                if (c == '"') {
                    return out.toString();
                }
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                char escaped = text.charAt(at++);
                switch (escaped) {
                    case 'n' -> out.append('\n');
                    case 't' -> out.append('\t');
                    case 'r' -> out.append('\r');
                    case 'b' -> out.append('\b');
                    case 'f' -> out.append('\f');
                    case 'u' -> {
                        out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
                        at += 4;
                    }
                    default -> out.append(escaped);
                }
            }
        }

        private void space() {
            while (at < text.length() && Character.isWhitespace(text.charAt(at))) {
                at++;
            }
        }

        private boolean peek(char c) {
            if (at < text.length() && text.charAt(at) == c) {
                at++;
                return true;
            }
            return false;
        }

        private void expect(char c) {
            if (!peek(c)) {
                throw error("expected " + c);
            }
        }

        private IllegalArgumentException error(String what) {
            return new IllegalArgumentException("bad JSON at " + at + ": " + what);
        }
    }
}
