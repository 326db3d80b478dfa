package transferservice.cluster;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.net.HttpURLConnection;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.BiConsumer;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * A real search cluster of N nodes in one JVM, on 127.0.0.1, for tests: Elasticsearch or
 * OpenSearch, by the {@link Engine} given. This class is the part the two launchers share (the
 * ports, the cluster's settings, the commands, the health checks); each engine's launcher
 * supplies how one of its nodes is built, started and closed.
 *
 * <p>Standard output carries only the lines a harness reads: {@code ELASTICSEARCH_URL=...},
 * {@code ELASTICSEARCH_NODES=...} once the cluster is healthy (the same names for either
 * engine: the service reads {@code ELASTICSEARCH_URL} for both), then one line per command
 * ({@code stopped i}, {@code started i}, or {@code error ...}). Logs go to standard error.
 *
 * <p>Commands on standard input: {@code stop <i>} closes node i (its data is kept), {@code start
 * <i>} starts it again on the same ports and data, {@code health} prints the cluster's health
 * line. End of input or SIGTERM stops every node and deletes the data.
 */
public final class LocalCluster<N> {
    /** What differs between the engines. */
    public interface Engine<N> {
        /** {@code Elasticsearch 8.19.21 (Lucene 9.12.2)}, for the start-up line. */
        String describe();

        /**
         * Builds a node with these settings (values: strings, or lists of them; see
         * {@link LocalCluster#apply}).
         */
        N build(Map<String, Object> settings) throws Exception;

        void start(N node) throws Exception;

        void close(N node) throws IOException;

        /** Whether the start failed because a port was taken. */
        boolean isBindFailure(Throwable e);
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
    }

    /** The launcher's main: {@code [--nodes N] [--setting key=value ...]}. */
    public static <N> void run(String[] args, Engine<N> engine) throws Exception {
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

    /** Whether {@code e} or one of its causes is a {@link java.net.BindException}. */
    public static boolean causedByBindException(Throwable e) {
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof java.net.BindException) {
                return true;
            }
        }
        return false;
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
                        waitForHealth(runningNodes(), "yellow");
                        reply("started " + i);
                    }
                    case "health" -> reply("health " + get(anyRunningUrl(), "/_cluster/health"));
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
        int i = Integer.parseInt(words[1]);
        if (i < 0 || i >= nodeCount) {
            throw new IllegalArgumentException("no node " + i + "; nodes are 0 to " + (nodeCount - 1));
        }
        return i;
    }

    private static void reply(String line) {
        System.out.println(line);
        System.out.flush();
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
            engine.start(node);
        } catch (Exception e) {
            // Release its data directory's lock, so that a later start may use it.
            engine.close(node);
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
        engine.close(node);
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
        String path = "/_cluster/health?wait_for_nodes=" + expectedNodes + "&wait_for_status=" + status
                + "&wait_for_no_initializing_shards=true&timeout=5s";
        long deadline = System.nanoTime() + 120_000_000_000L;
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

    private static String get(String base, String path) throws IOException {
        HttpURLConnection connection = (HttpURLConnection) URI.create(base + path).toURL().openConnection();
        connection.setConnectTimeout(2_000);
        connection.setReadTimeout(30_000);
        try (var body = connection.getResponseCode() < 400 ? connection.getInputStream() : connection.getErrorStream()) {
            return new String(body.readAllBytes(), StandardCharsets.UTF_8);
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
                    engine.close(node);
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
}
