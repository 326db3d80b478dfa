package transferservice.escluster;

import java.io.IOException;
import java.util.List;
import java.util.Map;

import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.node.ClasspathNode;
import org.elasticsearch.node.Node;
import org.elasticsearch.transport.netty4.Netty4Plugin;

import transferservice.cluster.LocalCluster;

/**
 * A real Elasticsearch cluster of N nodes in one JVM, on 127.0.0.1, for tests
 * ({@link LocalCluster} runs it: ports, commands, health).
 *
 * <p>Each node is Elastic's own server ({@code org.elasticsearch:elasticsearch}) with the Netty
 * transport module, started through {@link ClasspathNode} so that the module is loaded from the
 * classpath instead of a distribution's {@code modules/} directory.
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
}
