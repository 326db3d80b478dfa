package org.elasticsearch.node;

import java.util.Collection;
import java.util.Map;
import java.util.function.Function;

import org.elasticsearch.cluster.node.DiscoveryNode;
import org.elasticsearch.cluster.service.ClusterService;
import org.elasticsearch.common.settings.ClusterSettings;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.common.transport.BoundTransportAddress;
import org.elasticsearch.env.Environment;
import org.elasticsearch.plugins.MockPluginsService;
import org.elasticsearch.plugins.Plugin;
import org.elasticsearch.plugins.PluginsLoader;
import org.elasticsearch.plugins.PluginsService;
import org.elasticsearch.tasks.TaskManager;
import org.elasticsearch.telemetry.tracing.Tracer;
import org.elasticsearch.test.transport.MockTransportService;
import org.elasticsearch.threadpool.ThreadPool;
import org.elasticsearch.transport.Transport;
import org.elasticsearch.transport.TransportInterceptor;
import org.elasticsearch.transport.TransportService;

/**
 * An Elasticsearch node whose plugins (here, the Netty transport module) come from the classpath,
 * and whose node-to-node transport is the test framework's {@link MockTransportService}: the real
 * Netty transport, with rules that drop, fail or delay what this node sends to another (the
 * launcher's network faults). With no rule set it passes every message through unchanged.
 *
 * <p>This is what the test framework's {@code MockNode} does, without its test-only services:
 * {@code MockNode} reaches into {@code ESTestCase}, whose static set-up refuses to run as root,
 * and CI runs as root. It lives in Elasticsearch's package because {@link Node}'s constructor
 * from a {@link NodeConstruction} and {@link NodeServiceProvider} are package-private; everything
 * else (the engine, replication, the REST layer) is the unmodified server.
 */
public final class ClasspathNode extends Node {
    public ClasspathNode(Settings settings, Collection<Class<? extends Plugin>> plugins) {
        super(NodeConstruction.prepareConstruction(
                InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), null, () -> "es-cluster"),
                null,
                new ClasspathPlugins(plugins),
                true));
    }

    /**
     * The log lines' node and cluster ids are one JVM-wide value, set once; several nodes in
     * one JVM would set it again and fail (as {@code MockNode} also skips it).
     */
    @Override
    protected void configureNodeAndClusterIdStateListener(ClusterService clusterService) {}

    private static final class ClasspathPlugins extends NodeServiceProvider {
        private final Collection<Class<? extends Plugin>> plugins;

        ClasspathPlugins(Collection<Class<? extends Plugin>> plugins) {
            this.plugins = plugins;
        }

        @Override
        PluginsService newPluginService(Environment environment, PluginsLoader pluginsLoader) {
            return new MockPluginsService(environment.settings(), environment, plugins);
        }

        /** What {@code MockNode} does when a test asks for the mock transport. */
        @Override
        TransportService newTransportService(PluginsService pluginsService, Settings settings, Transport transport,
                ThreadPool threadPool, TransportInterceptor interceptor,
                Function<BoundTransportAddress, DiscoveryNode> localNodeFactory, ClusterSettings clusterSettings,
                TaskManager taskManager, Tracer tracer) {
            return new MockTransportService(settings, transport, threadPool, interceptor, localNodeFactory,
                    clusterSettings, taskManager.getTaskHeaders());
        }
    }
}
