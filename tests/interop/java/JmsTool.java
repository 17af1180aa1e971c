import java.util.ArrayList;
import java.util.Base64;
import java.util.Enumeration;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import javax.jms.BytesMessage;
import javax.jms.Connection;
import javax.jms.DeliveryMode;
import javax.jms.Destination;
import javax.jms.MapMessage;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.ObjectMessage;
import javax.jms.Session;
import javax.jms.StreamMessage;
import javax.jms.TextMessage;

import org.apache.activemq.ActiveMQConnectionFactory;

/**
 * A Java JMS peer for mdb's interop tests, on ActiveMQ's own client (OpenWire). Every command
 * prints one JSON object per line on stdout, so the Python side reads what Java saw.
 *
 *   send URL USER PASSWORD QUEUE KIND BODY [name=value ...]   KIND: text, bytes, map, object,
 *        stream, plain; options among the pairs: JMSPriority, JMSTimeToLive (ms), JMSDeliveryMode
 *        (persistent|non-persistent), JMSCorrelationID, JMSType, JMSReplyTo (queue name); any
 *        other pair is a string property, or one of another type where the name ends in :int,
 *        :long, :boolean or :double (qty:int=3).
 *   receive URL USER PASSWORD QUEUE COUNT TIMEOUT_MS [SELECTOR]   prints each message taken
 *        (only messages matching the JMS SELECTOR, when one is given).
 *   request URL USER PASSWORD QUEUE TEXT TIMEOUT_MS [name=value ...]   sends a TextMessage
 *        whose JMSReplyTo is a TemporaryQueue (options as for send), prints it, then prints the
 *        reply (or a timeout) taken from the temporary queue.
 *   reply-server URL USER PASSWORD QUEUE COUNT TIMEOUT_MS [KIND]   answers COUNT requests from
 *        QUEUE as a JMS replier does: a message of KIND (text, the default, map, object, stream,
 *        plain) holding "reply to " + the request's text, sent to its JMSReplyTo with
 *        JMSCorrelationID set to the request's JMSCorrelationID, or its JMSMessageID when it has
 *        none; prints each request.
 *   consume URL USER PASSWORD QUEUE ROLLBACK_TEXT   consumes QUEUE in a transacted session
 *        (prefetch 1, redelivered at once after a rollback) until its standard input closes:
 *        rolls back the first delivery of a TextMessage whose text is ROLLBACK_TEXT and commits
 *        every other; prints each message after its commit or rollback, with "outcome"
 *        ("committed" or "rolled back").
 */
public final class JmsTool {
    public static void main(String[] args) throws Exception {
        ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(args[1]);
        factory.setUserName(args[2].isEmpty() ? null : args[2]);
        factory.setPassword(args[3].isEmpty() ? null : args[3]);
        // A consumer sharing a queue takes one message at a time, as mdb's pool slots do, and
        // gets a rolled back one again at once.
        factory.getPrefetchPolicy().setQueuePrefetch(1);
        factory.getRedeliveryPolicy().setInitialRedeliveryDelay(0);
        factory.getRedeliveryPolicy().setRedeliveryDelay(0);
        Connection connection = factory.createConnection();
        try {
            connection.start();
            boolean transacted = args[0].equals("consume");
            Session session = connection.createSession(
                transacted, transacted ? Session.SESSION_TRANSACTED : Session.AUTO_ACKNOWLEDGE);
            switch (args[0]) {
                case "send":
                    send(session, args);
                    break;
                case "receive":
                    receive(session, args[4], Integer.parseInt(args[5]), Long.parseLong(args[6]),
                            args.length > 7 ? args[7] : null);
                    break;
                case "request":
                    request(session, args);
                    break;
                case "reply-server":
                    replyServer(session, args[4], Integer.parseInt(args[5]),
                                Long.parseLong(args[6]), args.length > 7 ? args[7] : "text");
                    break;
                case "consume":
                    consume(session, args[4], args[5]);
                    break;
                default:
                    throw new IllegalArgumentException("unknown command " + args[0]);
            }
        } finally {
            connection.close();
        }
    }

    private static void send(Session session, String[] args) throws Exception {
        Message message = make(session, args[5], args[6]);
        sendWithOptions(session, session.createQueue(args[4]), message, args, 7);
        System.out.println(describe(message));
    }

    private static void request(Session session, String[] args) throws Exception {
        Message message = session.createTextMessage(args[5]);
        Destination replies = session.createTemporaryQueue();
        message.setJMSReplyTo(replies);
        sendWithOptions(session, session.createQueue(args[4]), message, args, 7);
        System.out.println(describe(message));
        Message reply = session.createConsumer(replies).receive(Long.parseLong(args[6]));
        System.out.println(reply == null ? "{\"timeout\": true}" : describe(reply));
    }

    private static void replyServer(Session session, String name, int count, long timeout,
                                    String kind) throws Exception {
        MessageConsumer consumer = session.createConsumer(session.createQueue(name));
        MessageProducer producer = session.createProducer(null);
        for (int i = 0; i < count; i++) {
            Message request = consumer.receive(timeout);
            if (request == null) {
                System.out.println("{\"timeout\": true}");
                return;
            }
            String text = request instanceof TextMessage ? ((TextMessage) request).getText() : "";
            Message reply = make(session, kind, "reply to " + text);
            String correlation = request.getJMSCorrelationID();
            reply.setJMSCorrelationID(correlation != null ? correlation
                                                          : request.getJMSMessageID());
            producer.send(request.getJMSReplyTo(), reply);
            System.out.println(describe(request));
        }
    }

    private static void consume(Session session, String name, String rollbackText)
            throws Exception {
        MessageConsumer consumer = session.createConsumer(session.createQueue(name));
        consumer.setMessageListener(message -> {
            try {
                boolean rollback = message instanceof TextMessage
                    && rollbackText.equals(((TextMessage) message).getText())
                    && !message.getJMSRedelivered();
                if (rollback) {
                    session.rollback();
                } else {
                    session.commit();
                }
                String described = describe(message);
                System.out.println("{\"outcome\": \"" + (rollback ? "rolled back" : "committed")
                                   + "\", " + described.substring(1));
                System.out.flush();
            } catch (Exception e) {
                e.printStackTrace();
                System.exit(1);
            }
        });
        while (System.in.read() != -1) {
            // Runs until the test closes standard input; the listener does the work.
        }
        consumer.close();
    }

    /** Sends the message to the queue with the name=value options of args from index first. */
    private static void sendWithOptions(Session session, Destination queue, Message message,
                                        String[] args, int first) throws Exception {
        MessageProducer producer = session.createProducer(queue);
        int priority = Message.DEFAULT_PRIORITY;
        long ttl = Message.DEFAULT_TIME_TO_LIVE;
        int mode = DeliveryMode.PERSISTENT;
        for (int i = first; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            switch (pair[0]) {
                case "JMSPriority": priority = Integer.parseInt(pair[1]); break;
                case "JMSTimeToLive": ttl = Long.parseLong(pair[1]); break;
                case "JMSDeliveryMode":
                    mode = pair[1].equals("persistent") ? DeliveryMode.PERSISTENT
                                                        : DeliveryMode.NON_PERSISTENT;
                    break;
                case "JMSCorrelationID": message.setJMSCorrelationID(pair[1]); break;
                case "JMSType": message.setJMSType(pair[1]); break;
                case "JMSReplyTo": message.setJMSReplyTo(session.createQueue(pair[1])); break;
                default: setProperty(message, pair[0], pair[1]);
            }
        }
        producer.send(message, mode, priority, ttl);
    }

    /** A property from a name=value pair: a String, or the type its name ends in (qty:int). */
    private static void setProperty(Message message, String name, String value) throws Exception {
        String[] typed = name.split(":", 2);
        switch (typed.length == 2 ? typed[1] : "string") {
            case "int": message.setIntProperty(typed[0], Integer.parseInt(value)); break;
            case "long": message.setLongProperty(typed[0], Long.parseLong(value)); break;
            case "boolean": message.setBooleanProperty(typed[0], Boolean.parseBoolean(value)); break;
            case "double": message.setDoubleProperty(typed[0], Double.parseDouble(value)); break;
            case "string": message.setStringProperty(name, value); break;
            default: throw new IllegalArgumentException("unknown property type in " + name);
        }
    }

    private static Message make(Session session, String kind, String body) throws Exception {
        switch (kind) {
            case "text":
                return session.createTextMessage(body);
            case "bytes": {
                BytesMessage m = session.createBytesMessage();
                m.writeBytes(Base64.getDecoder().decode(body));
                return m;
            }
            case "map": {
                MapMessage m = session.createMapMessage();
                m.setString("body", body);
                return m;
            }
            case "object":
                return session.createObjectMessage(body);
            case "stream": {
                StreamMessage m = session.createStreamMessage();
                m.writeString(body);
                return m;
            }
            case "plain":
                return session.createMessage();
            default:
                throw new IllegalArgumentException("unknown kind " + kind);
        }
    }

    private static void receive(Session session, String name, int count, long timeout,
                                String selector) throws Exception {
        MessageConsumer consumer = session.createConsumer(session.createQueue(name), selector);
        for (int i = 0; i < count; i++) {
            Message message = consumer.receive(timeout);
            if (message == null) {
                System.out.println("{\"timeout\": true}");
                return;
            }
            System.out.println(describe(message));
        }
    }

    private static String describe(Message m) throws Exception {
        Map<String, String> fields = new TreeMap<>();
        String kind = m instanceof TextMessage ? "text" : m instanceof BytesMessage ? "bytes"
            : m instanceof MapMessage ? "map" : m instanceof ObjectMessage ? "object"
            : m instanceof StreamMessage ? "stream" : "plain";
        fields.put("kind", kind);
        if (m instanceof TextMessage) {
            fields.put("text", ((TextMessage) m).getText());
        } else if (m instanceof BytesMessage) {
            BytesMessage b = (BytesMessage) m;
            b.reset();  // a message just sent is write-only until reset
            byte[] data = new byte[(int) b.getBodyLength()];
            b.readBytes(data);
            fields.put("bytes", Base64.getEncoder().encodeToString(data));
        }
        fields.put("JMSMessageID", m.getJMSMessageID());
        fields.put("JMSPriority", Integer.toString(m.getJMSPriority()));
        fields.put("JMSExpiration", Long.toString(m.getJMSExpiration()));
        fields.put("JMSDeliveryMode",
                   m.getJMSDeliveryMode() == DeliveryMode.PERSISTENT ? "persistent" : "non-persistent");
        fields.put("JMSRedelivered", Boolean.toString(m.getJMSRedelivered()));
        fields.put("JMSCorrelationID", m.getJMSCorrelationID());
        fields.put("JMSType", m.getJMSType());
        fields.put("JMSReplyTo", m.getJMSReplyTo() == null ? null : m.getJMSReplyTo().toString());
        List<String> props = new ArrayList<>();
        List<String> types = new ArrayList<>();
        for (Enumeration<?> e = m.getPropertyNames(); e.hasMoreElements();) {
            String key = (String) e.nextElement();
            Object value = m.getObjectProperty(key);
            props.add(json(key) + ": " + json(String.valueOf(value)));
            types.add(json(key) + ": "
                      + json(value == null ? null : value.getClass().getSimpleName()));
        }
        StringBuilder out = new StringBuilder("{");
        for (Map.Entry<String, String> f : fields.entrySet()) {
            out.append(json(f.getKey())).append(": ").append(json(f.getValue())).append(", ");
        }
        out.append("\"properties\": {").append(String.join(", ", props)).append("}, ");
        out.append("\"propertyTypes\": {").append(String.join(", ", types)).append("}}");
        return out.toString();
    }

    private static String json(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
