package transferservice.escluster;

import java.io.IOException;
import java.util.List;
import java.util.Map;

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
    public boolean isBindFailure(Throwable e) {
        return LocalCluster.causedByBindFailure(e, org.elasticsearch.transport.BindTransportException.class,
                org.elasticsearch.http.BindHttpException.class);
    }

    @Override
    public void addFault(Node from, int port, LocalCluster.Fault fault) throws IOException {
        MockTransportService transport = transport(from);
        TransportAddress address = new TransportAddress(LocalCluster.transportAddress(port));
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
     * later ({@link LocalCluster#sendLater}), in the sender's thread context, holding a reference
     * to the request until then; should the late send fail, the request's response handler is
     * told.
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
            LocalCluster.sendLater(millis, threadPool.getThreadContext()::preserveContext, () -> {
                try {
                    connection.sendRequest(requestId, action, request, options);
                } finally {
                    request.decRef();
                }
            }, e -> {
                var context = handlers.remove(requestId);
                if (context != null) {
                    var failure = new SendRequestTransportException(connection.getNode(), action, e);
                    threadPool.generic().execute(() -> context.handler().handleException(failure));
                }
            });
        });
    }

    @Override
    public void clearFaults(Node node, int[] ports) throws IOException {
        MockTransportService transport = transport(node);
        for (int port : ports) {
            transport.clearOutboundRules(new TransportAddress(LocalCluster.transportAddress(port)));
        }
        transport.clearAllRules();
    }

    private static MockTransportService transport(Node node) {
        return (MockTransportService) node.injector().getInstance(TransportService.class);
    }
}
