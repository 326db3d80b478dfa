package transferservice.escluster;

import java.io.IOException;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.common.transport.TransportAddress;
import org.elasticsearch.node.ClasspathNode;
import org.elasticsearch.node.Node;
import org.elasticsearch.test.transport.MockTransportService;
import org.elasticsearch.test.transport.StubbableTransport;
import org.elasticsearch.threadpool.ThreadPool;
import org.elasticsearch.transport.SendRequestTransportException;
import org.elasticsearch.transport.Transport;
import org.elasticsearch.transport.TransportService;
import org.elasticsearch.transport.netty4.Netty4Plugin;

import transferservice.cluster.LocalCluster;

/**
 * A real Elasticsearch cluster of N nodes in one JVM, on 127.0.0.1, for tests
 * ({@link LocalCluster} runs it: ports, commands, health).
 *
 * <p>Each node is Elastic's own server ({@code org.elasticsearch:elasticsearch}) with the Netty
 * transport module, started through {@link ClasspathNode} so that the module is loaded from the
 * classpath instead of a distribution's {@code modules/} directory, and with the test framework's
 * {@link MockTransportService} as its node-to-node transport, whose rules are the launcher's
 * network faults.
 */
public final class EsCluster implements LocalCluster.Engine<Node> {
    /**
     * Sends what a slowed node sends, when its delay is up: one thread, so that the messages to a
     * node leave in the order they were sent (they all wait the same time).
     */
    private static final ScheduledExecutorService DELAYED_SENDS = Executors.newSingleThreadScheduledExecutor(task -> {
        Thread thread = new Thread(task, "es-cluster-delayed-sends");
        thread.setDaemon(true);
        return thread;
    });

    public static void main(String[] args) throws Exception {
        // What a distribution's bootstrap does before it builds a node: route the server's own
        // logging facade to log4j (configured by log4j2.properties, to standard error).
        LogConfigurator.configureESLogging();
        LocalCluster.run(args, new EsCluster());
    }

    @Override
    public String describe() {
        return "Elasticsearch " + org.elasticsearch.Build.current().qualifiedVersion() + " (Lucene "
                + org.apache.lucene.util.Version.LATEST + ")";
    }

    @Override
    public Node build(Map<String, Object> settings) {
        Settings.Builder builder = Settings.builder();
        LocalCluster.apply(settings, builder::put, builder::putList);
        return new ClasspathNode(builder.build(), List.of(Netty4Plugin.class, RootEndpointPlugin.class));
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
            if (cause instanceof org.elasticsearch.transport.BindTransportException
                    || cause instanceof org.elasticsearch.http.BindHttpException) {
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
     * later from {@link #DELAYED_SENDS}, in the sender's thread context, holding a reference to
     * the request until then; should the late send fail, the request's response handler is told,
     * as the transport service does when a send fails at once.
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
            request.incRef();
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
                } finally {
                    request.decRef();
                }
            });
            DELAYED_SENDS.schedule(send, millis, TimeUnit.MILLISECONDS);
        });
    }

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
}
