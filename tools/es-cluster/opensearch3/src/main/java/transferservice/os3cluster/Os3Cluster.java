package transferservice.os3cluster;

import java.io.IOException;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

import org.opensearch.cluster.node.DiscoveryNode;
import org.opensearch.cluster.service.ClusterService;
import org.opensearch.common.settings.ClusterSettings;
import org.opensearch.common.settings.Settings;
import org.opensearch.core.common.transport.BoundTransportAddress;
import org.opensearch.core.common.transport.TransportAddress;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.plugins.PluginInfo;
import org.opensearch.telemetry.tracing.Tracer;
import org.opensearch.test.transport.MockTransportService;
import org.opensearch.test.transport.StubbableTransport;
import org.opensearch.threadpool.ThreadPool;
import org.opensearch.transport.Netty4ModulePlugin;
import org.opensearch.transport.SendRequestTransportException;
import org.opensearch.transport.Transport;
import org.opensearch.transport.TransportInterceptor;
import org.opensearch.transport.TransportService;

import transferservice.cluster.LocalCluster;

/**
 * A real OpenSearch 3.x cluster of N nodes in one JVM, on 127.0.0.1, for tests
 * ({@link LocalCluster} runs it: ports, commands, health, the same output lines as for
 * Elasticsearch and OpenSearch 2.19).
 *
 * <p>The 2.19 launcher ({@code transferservice.oscluster.OsCluster}) built against 3.x, where
 * three things changed: the Netty module's plugin class is {@link Netty4ModulePlugin}, a node is
 * given its classpath plugins as {@link PluginInfo}s, and a node's transport service is built with
 * a second (stream) transport. Those change signatures the 2.19 source names, so this is a
 * copy of that source (the network faults are its code unchanged) rather than the same file.
 *
 * <p>OpenSearch 3.x has no Java SecurityManager: a distribution's JVM starts with its java agent
 * ({@code -javaagent:opensearch-agent.jar}), whose checks follow the policy that
 * {@code org.opensearch.bootstrap.Security} installs. A node built with {@code new
 * Node(..)}, as here, never passes through that bootstrap, and nothing in the node itself asks
 * for the agent or its policy: without them nothing is checked, so nothing is denied, as under
 * the 2.19 launcher, which runs without a SecurityManager.
 */
public final class Os3Cluster implements LocalCluster.Engine<Node> {
    /**
     * Sends what a slowed node sends, when its delay is up: one thread, so that the messages to a
     * node leave in the order they were sent (they all wait the same time).
     */
    private static final ScheduledExecutorService DELAYED_SENDS = Executors.newSingleThreadScheduledExecutor(task -> {
        Thread thread = new Thread(task, "os3-cluster-delayed-sends");
        thread.setDaemon(true);
        return thread;
    });

    public static void main(String[] args) throws Exception {
        LocalCluster.run(args, new Os3Cluster());
    }

    @Override
    public String describe() {
        return "OpenSearch " + org.opensearch.Version.CURRENT + " (Lucene " + org.apache.lucene.util.Version.LATEST + ")";
    }

    @Override
    public Node build(Map<String, Object> settings) {
        Settings.Builder builder = Settings.builder();
        // OpenSearch's name for the bootstrap list (the Elasticsearch name is deprecated).
        LocalCluster.apply(settings, builder::put, (key, list) -> builder.putList(
                key.equals("cluster.initial_master_nodes") ? "cluster.initial_cluster_manager_nodes" : key, list));
        return new ClasspathNode(builder.build(), List.of(Netty4ModulePlugin.class));
    }

    @Override
    public void start(Node node) throws Exception {
        node.start();
    }

    @Override
    public void close(Node node) throws IOException {
        node.close();
    }

    @Override
    public boolean isBindFailure(Throwable e) {
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof org.opensearch.transport.BindTransportException
                    || cause instanceof org.opensearch.http.BindHttpException) {
                return true;
            }
        }
        return LocalCluster.causedByBindException(e);
    }

    @Override
    public void addFault(Node from, int port, LocalCluster.Fault fault) throws UnknownHostException {
        MockTransportService transport = transport(from);
        TransportAddress address = address(port);
        // A rule it had for that node goes first (an unresponsive one closes the connections it
        // held up, as a TCP time-out eventually would).
        transport.clearOutboundRules(address);
        switch (fault) {
            case DISCONNECT -> transport.addFailToSendNoConnectRule(address);
            case UNRESPONSIVE -> transport.addUnresponsiveRule(address);
        }
    }

    /**
     * A default send rule (rules for one node come first): each request is sent {@code millis}
     * later from {@link #DELAYED_SENDS}, in the sender's thread context; should the late send
     * fail, the request's response handler is told, as the transport service does when a send
     * fails at once.
     */
    @Override
    public void setDelay(Node node, long millis) {
        MockTransportService transport = transport(node);
        if (millis <= 0) {
            transport.addSendBehavior((StubbableTransport.SendRequestBehavior) null);
            return;
        }
        ThreadPool threadPool = transport.getThreadPool();
        Transport.ResponseHandlers handlers = transport.transport().getResponseHandlers();
        transport.addSendBehavior((connection, requestId, action, request, options) -> {
            Runnable send = threadPool.getThreadContext().preserveContext(() -> {
                try {
                    connection.sendRequest(requestId, action, request, options);
                } catch (Exception e) {
                    var context = handlers.remove(requestId);
                    if (context != null) {
                        var failure = new SendRequestTransportException(connection.getNode(), action, e);
                        try {
                            threadPool.generic().execute(() -> context.handler().handleException(failure));
                        } catch (RuntimeException closing) {
                            // The node is closing: its handlers are failed as it closes.
                        }
                    }
                }
            });
            DELAYED_SENDS.schedule(send, millis, TimeUnit.MILLISECONDS);
        });
    }

    /**
     * Clears one address at a time first: OpenSearch's {@code clearAllRules} forgets the rules
     * without their clean-up (an unresponsive rule's connections would stay open, and what was
     * sent on them unanswered).
     */
    @Override
    public void clearFaults(Node node, int[] ports) throws UnknownHostException {
        MockTransportService transport = transport(node);
        for (int port : ports) {
            transport.clearOutboundRules(address(port));
        }
        transport.clearAllRules();
    }

    private static MockTransportService transport(Node node) {
        return (MockTransportService) node.injector().getInstance(TransportService.class);
    }

    /** A node's transport address as the others know it (its publish address: 127.0.0.1). */
    private static TransportAddress address(int port) throws UnknownHostException {
        return new TransportAddress(InetAddress.getByAddress(new byte[] {127, 0, 0, 1}), port);
    }

    /**
     * An OpenSearch node whose plugins come from the classpath (its protected constructor, which
     * takes them as {@link PluginInfo}s, described as {@code MockNode} does) and whose transport
     * service is the test framework's {@link MockTransportService}.
     */
    private static final class ClasspathNode extends Node {
        ClasspathNode(Settings settings, Collection<Class<? extends Plugin>> plugins) {
            super(InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), null, () -> "os3-cluster"),
                    plugins.stream().map(ClasspathNode::info).toList(), true);
        }

        private static PluginInfo info(Class<? extends Plugin> plugin) {
            return new PluginInfo(plugin.getName(), "classpath plugin", "NA", org.opensearch.Version.CURRENT,
                    "21", plugin.getName(), null, List.of(), false);
        }

        /**
         * The log lines' node and cluster ids are one JVM-wide value, set once; several nodes in
         * one JVM would set it again and fail (as {@code MockNode} also skips it).
         */
        @Override
        protected void configureNodeAndClusterIdStateListener(ClusterService clusterService) {}

        /**
         * What {@code MockNode} does when a test asks for the mock transport; the stream
         * transport (Arrow Flight, a plugin's, absent here) is passed on as it comes.
         */
        @Override
        protected TransportService newTransportService(Settings settings, Transport transport, Transport streamTransport,
                ThreadPool threadPool, TransportInterceptor interceptor,
                Function<BoundTransportAddress, DiscoveryNode> localNodeFactory, ClusterSettings clusterSettings,
                Set<String> taskHeaders, Tracer tracer) {
            return new MockTransportService(settings, transport, streamTransport, threadPool, interceptor,
                    localNodeFactory, clusterSettings, taskHeaders, tracer);
        }
    }
}
