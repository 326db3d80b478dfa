package transferservice.oscluster;

import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Function;

import org.opensearch.cluster.node.DiscoveryNode;
import org.opensearch.cluster.service.ClusterService;
import org.opensearch.common.settings.ClusterSettings;
import org.opensearch.common.settings.Settings;
import org.opensearch.core.common.transport.BoundTransportAddress;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.telemetry.tracing.Tracer;
import org.opensearch.test.transport.MockTransportService;
import org.opensearch.threadpool.ThreadPool;
import org.opensearch.transport.Netty4Plugin;
import org.opensearch.transport.Transport;
import org.opensearch.transport.TransportInterceptor;
import org.opensearch.transport.TransportService;

import transferservice.cluster.LocalCluster;
import transferservice.opensearch.OpenSearchEngine;

/**
 * A real OpenSearch cluster of N nodes in one JVM, on 127.0.0.1, for tests
 * ({@link LocalCluster} runs it: ports, commands, health, the same output lines as for
 * Elasticsearch).
 *
 * <p>Each node is OpenSearch's own server ({@code org.opensearch:opensearch}) with its Netty
 * transport module ({@link Netty4Plugin}); the rest, network faults included, is
 * {@link OpenSearchEngine}, which the 3.x launcher shares.
 */
public final class OsCluster extends OpenSearchEngine {
    public static void main(String[] args) throws Exception {
        LocalCluster.run(args, new OsCluster());
    }

    @Override
    protected Node node(Settings settings) {
        return new ClasspathNode(settings, List.of(Netty4Plugin.class));
    }

    /**
     * An OpenSearch node whose plugins come from the classpath (its protected constructor) and
     * whose transport service is the test framework's {@link MockTransportService}.
     */
    private static final class ClasspathNode extends Node {
        ClasspathNode(Settings settings, Collection<Class<? extends Plugin>> plugins) {
            super(InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), null, () -> "os-cluster"), plugins, true);
        }

        /**
         * The log lines' node and cluster ids are one JVM-wide value, set once; several nodes in
         * one JVM would set it again and fail (as {@code MockNode} also skips it).
         */
        @Override
        protected void configureNodeAndClusterIdStateListener(ClusterService clusterService) {}

        /** What {@code MockNode} does when a test asks for the mock transport. */
        @Override
        protected TransportService newTransportService(Settings settings, Transport transport, ThreadPool threadPool,
                TransportInterceptor interceptor, Function<BoundTransportAddress, DiscoveryNode> localNodeFactory,
                ClusterSettings clusterSettings, Set<String> taskHeaders, Tracer tracer) {
            return new MockTransportService(settings, transport, threadPool, interceptor, localNodeFactory,
                    clusterSettings, taskHeaders, tracer);
        }
    }
}
