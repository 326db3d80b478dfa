package transferservice.oscluster;

import java.io.IOException;
import java.util.Collection;
import java.util.List;
import java.util.Map;

import org.opensearch.cluster.service.ClusterService;
import org.opensearch.common.settings.Settings;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

import transferservice.cluster.LocalCluster;

/**
 * A real OpenSearch cluster of N nodes in one JVM, on 127.0.0.1, for tests
 * ({@link LocalCluster} runs it: ports, commands, health, the same output lines as for
 * Elasticsearch).
 *
 * <p>Each node is OpenSearch's own server ({@code org.opensearch:opensearch}) with its Netty
 * transport module loaded from the classpath, as the OpenSearch test framework's {@code MockNode}
 * does (without its test-only services).
 */
public final class OsCluster implements LocalCluster.Engine<Node> {
    public static void main(String[] args) throws Exception {
        LocalCluster.run(args, new OsCluster());
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
        return new ClasspathNode(builder.build(), List.of(Netty4Plugin.class));
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

    /** An OpenSearch node whose plugins come from the classpath (its protected constructor). */
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
    }
}
