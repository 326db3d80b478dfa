package transferservice.os3cluster;

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
import org.opensearch.plugins.PluginInfo;
import org.opensearch.telemetry.tracing.Tracer;
import org.opensearch.test.transport.MockTransportService;
import org.opensearch.threadpool.ThreadPool;
import org.opensearch.transport.Netty4ModulePlugin;
import org.opensearch.transport.Transport;
import org.opensearch.transport.TransportInterceptor;
import org.opensearch.transport.TransportService;

import transferservice.cluster.LocalCluster;
import transferservice.opensearch.OpenSearchEngine;

/**
 * A real OpenSearch 3.x cluster of N nodes in one JVM, on 127.0.0.1, for tests
 * ({@link LocalCluster} runs it: ports, commands, health, the same output lines as for
 * Elasticsearch and OpenSearch 2.19).
 *
 * <p>The 2.19 launcher ({@code transferservice.oscluster.OsCluster}) built against 3.x, where
 * three things changed: the Netty module's plugin class is {@link Netty4ModulePlugin}, a node is
 * given its classpath plugins as {@link PluginInfo}s, and a node's transport service is built with
 * a second (stream) transport. Those change signatures the 2.19 source names, so this file builds
 * the nodes; the rest, network faults included, is {@link OpenSearchEngine}, the 2.19 launcher's
 * too, compiled against 3.x.
 *
 * <p>OpenSearch 3.x has no Java SecurityManager: a distribution's JVM starts with its java agent
 * ({@code -javaagent:opensearch-agent.jar}), whose checks follow the policy that
 * {@code org.opensearch.bootstrap.Security} installs. A node built with {@code new
 * Node(..)}, as here, never passes through that bootstrap, and nothing in the node itself asks
 * for the agent or its policy: without them nothing is checked, so nothing is denied, as under
 * the 2.19 launcher, which runs without a SecurityManager.
 */
public final class Os3Cluster extends OpenSearchEngine {
    public static void main(String[] args) throws Exception {
        LocalCluster.run(args, new Os3Cluster());
    }

    @Override
    protected Node node(Settings settings) {
        return new ClasspathNode(settings, List.of(Netty4ModulePlugin.class));
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
