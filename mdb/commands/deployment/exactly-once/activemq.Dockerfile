# ActiveMQ Classic as mdb's tests run it: Debian's package (5.17) with mdb's reference config
# (activemq.xml beside this file, written by `mdb deploy-files`; docs/activemq.md). mdb's
# login comes from credentials.properties, a secret mounted in /etc/mdb-activemq.
FROM debian:bookworm-slim

# (man1: openjdk's package links its manual there, which slim images leave out)
RUN mkdir -p /usr/share/man/man1 && apt-get update \
    && apt-get install -y --no-install-recommends activemq \
    && rm -rf /var/lib/apt/lists/*

COPY activemq.xml /etc/mdb-activemq/activemq.xml
# Debian's 5.17 logs through log4j 1.2 and ships no configuration for it: to the console.
RUN printf '%s\n' 'log4j.rootLogger=INFO, console' \
        'log4j.appender.console=org.apache.log4j.ConsoleAppender' \
        'log4j.appender.console.layout=org.apache.log4j.PatternLayout' \
        'log4j.appender.console.layout.ConversionPattern=%d | %-5p | %m | %c%n' \
        > /etc/mdb-activemq/log4j.properties \
    && install -d -o activemq -g activemq /var/lib/mdb-activemq

USER activemq
VOLUME /var/lib/mdb-activemq
EXPOSE 61613
# The broker stops in order on SIGTERM (its store stays consistent; a kill -9 is recovered too).
ENTRYPOINT ["java", "-Xmx512m", "-Dactivemq.home=/usr/share/activemq", \
            "-Dactivemq.base=/var/lib/mdb-activemq", "-Dactivemq.conf=/etc/mdb-activemq", \
            "-Dactivemq.data=/var/lib/mdb-activemq", "-Dactivemq.classpath=/etc/mdb-activemq", \
            "-jar", "/usr/share/activemq/bin/activemq.jar", "start", \
            "xbean:file:/etc/mdb-activemq/activemq.xml"]
