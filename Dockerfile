# The app image (compose.yaml). Offline at run time: no analytics, no model hub, no telemetry.
FROM python:3.11-slim
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
ENV GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 ORT_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
EXPOSE 7860
# 0.0.0.0 inside the container only; compose publishes the port on the host's 127.0.0.1.
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
