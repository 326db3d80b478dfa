package transferservice.opensearch;

import java.io.IOException;
import java.util.Map;

import org.opensearch.common.settings.Settings;
import org.opensearch.core.common.transport.TransportAddress;
import org.opensearch.node.Node;
import org.opensearch.test.transport.MockTransportService;
import org.opensearch.test.transport.StubbableTransport;
import org.opensearch.threadpool.ThreadPool;
import org.opensearch.transport.SendRequestTransportException;
import org.opensearch.transport.Transport;
import org.opensearch.transport.TransportService;

import transferservice.cluster.LocalCluster;

/**
 * What the OpenSearch launchers share, 2.19 ({@code transferservice.oscluster.OsCluster}) and
 * 3.x ({@code transferservice.os3cluster.Os3Cluster}): this source is compiled into each, against
 * its own OpenSearch (see their poms), where the names it uses are the same. Each launcher builds
 * its nodes ({@link #node}): the server with its Netty transport module loaded from the
 * classpath, as the OpenSearch test framework's {@code MockNode} does (without its test-only
 * services), and with the framework's {@link MockTransportService} as its node-to-node
 * transport, whose rules are the launcher's network faults, set here.
 */
public abstract class OpenSearchEngine implements LocalCluster.Engine<Node> {
    /** A node of this engine's version, with these settings. */
    protected abstract Node node(Settings settings);

    @Override
    public String describe() {
        return "OpenSearch " + org.opensearch.Version.CURRENT + " (Lucene " + org.apache.lucene.util.Version.LATEST + ")";
    }

    @Override
    public Node build(Map<String, Object> settings) {
        Settings.Builder builder = Settings.builder();
        // A search's reader context on a shard copy lives until its fetch or its free request
        // comes, or until it has been idle for search.default_keep_alive (5 min), checked every
        // search.keep_alive_interval (1 min). OpenSearch (2.19 and 3.9 alike) does not free the
        // contexts of a shard allocated to the node again (Elasticsearch does: its
        // elastic/elasticsearch#68539), so one whose fetch or free was lost in a cut keeps the
        // node's old copy, and its shard lock, for up to six minutes: the copy cannot come back
        // ("lock already held for [closing shard]") and the launcher's heal, which waits two
        // minutes for green, failed so on OpenSearch 3.9. Idle contexts end within 35 s here.
        // A --setting of either name overrides this (it is applied after).
        builder.put("search.default_keep_alive", "30s");
        builder.put("search.keep_alive_interval", "5s");
        // OpenSearch's name for the bootstrap list (the Elasticsearch name is deprecated).
        LocalCluster.apply(settings, builder::put, (key, list) -> builder.putList(
                key.equals("cluster.initial_master_nodes") ? "cluster.initial_cluster_manager_nodes" : key, list));
        return node(builder.build());
    }

    @Override
    public void start(Node node) throws Exception {
        node.start();
    }

    @Override
    public boolean isBindFailure(Throwable e) {
        return LocalCluster.causedByBindFailure(e, org.opensearch.transport.BindTransportException.class,
                org.opensearch.http.BindHttpException.class);
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
     * later ({@link LocalCluster#sendLater}), in the sender's thread context; should the late
     * send fail, the request's response handler is told.
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
        transport.addSendBehavior((connection, requestId, action, request, options) -> LocalCluster.sendLater(millis,
                threadPool.getThreadContext()::preserveContext,
                () -> connection.sendRequest(requestId, action, request, options),
                e -> {
                    var context = handlers.remove(requestId);
                    if (context != null) {
                        var failure = new SendRequestTransportException(connection.getNode(), action, e);
                        threadPool.generic().execute(() -> context.handler().handleException(failure));
                    }
                }));
    }

    /**
     * Clears one address at a time first: OpenSearch's {@code clearAllRules} forgets the rules
     * without their clean-up (an unresponsive rule's connections would stay open, and what was
     * sent on them unanswered).
     */
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
